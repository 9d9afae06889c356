"""A small Qwen-VL processor built offline, for mock VL runs on hosts without network.

Megatron-Bridge's mock VLM dataset loads a Hugging Face processor by path to turn synthetic
image conversations into token ids and patches. Hosts without network cannot fetch the real
Qwen3.5 processor, so this builds one with the same image processing (Qwen2-VL image processor
with Qwen3.5's 16-pixel patches, 2x2 merge, temporal patch 2, so the vision tower sees the
real patch layout) and a small byte-level BPE tokenizer holding the Qwen chat and vision
special tokens. Its token ids are small; :func:`vision_token_overrides` gives the provider
overrides that point the model at them. For functional runs only: the text ids are not the
Qwen3.5 vocabulary.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "user\nDescribe this image.\n",
    "assistant\nthe image shows a red object on a blue background.\n",
    "system\nYou are a helpful assistant.\n",
] * 50


def build(folder: str | Path, patch_size: int = 16, merge_size: int = 2, temporal_patch_size: int = 2) -> Path:
    """Write the processor to ``folder`` (loadable with ``AutoProcessor.from_pretrained``)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    from bridge_recipes.vl.byte_bpe import train_byte_bpe

    tok = train_byte_bpe(CORPUS, SPECIAL_TOKENS, vocab_size=512)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    pixels = dict(patch_size=patch_size, merge_size=merge_size, temporal_patch_size=temporal_patch_size)
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        video_processor=Qwen3VLVideoProcessor(**pixels),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    folder = Path(folder)
    processor.save_pretrained(folder)
    return folder


VISION_TOKENS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}


def _token_ids(folder: str | Path, tokens: dict[str, str]) -> dict[str, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    return {name: tok.token_to_id(t) for name, t in tokens.items()}


def vision_token_ids(folder: str | Path) -> dict[str, int]:
    """The processor's vision token ids under their model-config names (``image_token_id``, ...)."""
    return _token_ids(folder, VISION_TOKENS)


def vision_token_overrides(folder: str | Path) -> list[str]:
    """Runner overrides that give the model this processor's special-token ids."""
    ids = _token_ids(folder, {**VISION_TOKENS, "bos_token_id": "<|im_start|>", "eos_token_id": "<|im_end|>"})
    return [f"model.{k}={v}" for k, v in ids.items()] + [f"dataset.hf_processor_path={Path(folder)}"]
