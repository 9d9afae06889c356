"""The checkpoint processor a VL dataset is rendered with, and what pins the dataset to it.

:func:`load_processor` loads a Hugging Face folder's Qwen-VL processor (tokenizer, chat template,
image processor) and reads the fields a dataset records: patch geometry, pixel bounds and vision
token ids; :func:`processor_files` hashes the files the dataset is pinned to. The build renders
each conversation with :meth:`Processor.render`, and the dry run compares a dataset's pins with
the run's processor. :class:`VlDatasetError`, the build's bad-input error, lives here, the lowest
module that raises it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_recipes.chat.conversations import MalformedConversation
from bridge_recipes.utils.outputs import file_sha256
from bridge_recipes.vl.vl_conversations import VlConversation

# Where a Hugging Face folder keeps its image processor (transformers 5 saves it in processor_config.json).
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
# The processor files a dataset is pinned to (those present in the folder are hashed).
PROCESSOR_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    *IMAGE_PROCESSOR_FILES,
    "video_preprocessor_config.json",
)


class VlDatasetError(Exception):
    """Bad input to a VL dataset build; the message names the flag or file and the fix."""


@dataclass
class Processor:
    """A checkpoint's processor, loaded, with what pins a dataset to it."""

    folder: Path
    processor: Any
    files: dict[str, str]  # file name -> sha256
    fields: dict[str, Any]
    vision_texts: tuple[str, ...]  # special-token texts no conversation may carry

    def render(self, conversation: VlConversation, index: int) -> int:
        """Tokens of ``conversation`` through the chat template (one image token an image)."""
        for message in conversation.messages:
            for part in message["content"]:
                found = [t for t in self.vision_texts if part["type"] == "text" and t in part["text"]]
                if found:
                    raise MalformedConversation(
                        index, "vision_token_in_text", f"text holds {found[0]!r}, which would pass for an image token"
                    )
        try:
            text = self.processor.apply_chat_template(conversation.messages, tokenize=False)
            ids = self.processor.tokenizer(text)["input_ids"]
        except Exception as e:  # a template or tokenizer error on one conversation: counted, never fatal
            raise MalformedConversation(index, "render_failed", f"{type(e).__name__}: {e}") from None
        pads = ids.count(self.fields["image_token_id"])
        if pads != len(conversation.images):
            raise MalformedConversation(
                index,
                "render_failed",
                f"the chat template wrote {pads} image token(s) for {len(conversation.images)} image(s)",
            )
        return len(ids)


def processor_files(folder: Path) -> dict[str, str]:
    """sha256 of each of :data:`PROCESSOR_FILES` present in ``folder``."""
    return {name: file_sha256(folder / name) for name in PROCESSOR_FILES if (folder / name).is_file()}


def load_processor(folder: str | os.PathLike) -> Processor:
    """The Qwen-VL processor of a checkpoint folder (tokenizer, chat template, image processor)."""
    path = Path(folder).expanduser()
    hint = "pass the model's Hugging Face folder (its tokenizer, chat template and image processor)"
    if not path.is_dir():
        raise VlDatasetError(f"--processor {folder} is not a folder; {hint}")
    if not any((path / name).is_file() for name in IMAGE_PROCESSOR_FILES):
        raise VlDatasetError(
            f"--processor {path}: it has no image processor (preprocessor_config.json or processor_config.json); "
            f"{hint}. A toy made with "
            "--tokenizer-json has none: make it without (scripts/convert_checkpoint.py toy --out DIR)"
        )
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises OSError, ValueError, KeyError ... on an unusable folder
        raise VlDatasetError(
            f"--processor {path}: no processor loads from it ({type(e).__name__}: {e}); {hint}"
        ) from None
    image_processor = getattr(processor, "image_processor", None)
    tokenizer = getattr(processor, "tokenizer", None)
    image_token = getattr(processor, "image_token", None)
    if image_processor is None or tokenizer is None or not image_token:
        raise VlDatasetError(
            f"--processor {path}: {type(processor).__name__} is not a vision-language processor; {hint}"
        )
    if not getattr(processor, "chat_template", None):
        raise VlDatasetError(f"--processor {path} has no chat template (chat_template.jinja); {hint}")
    size = image_processor.size

    def token_id(text: str | None) -> int | None:
        return None if text is None else tokenizer.convert_tokens_to_ids(text)

    texts = {
        name: getattr(processor, name, None)
        for name in ("image_token", "video_token", "vision_start_token", "vision_end_token")
    }
    fields = {
        "class": type(processor).__name__,
        "patch_size": image_processor.patch_size,
        "merge_size": image_processor.merge_size,
        "temporal_patch_size": image_processor.temporal_patch_size,
        "min_pixels": size["shortest_edge"],
        "max_pixels": size["longest_edge"],
        "image_token": image_token,
        "image_token_id": token_id(image_token),
        "video_token_id": token_id(texts["video_token"]),
        "vision_start_token_id": token_id(texts["vision_start_token"]),
        "vision_end_token_id": token_id(texts["vision_end_token"]),
        "vocab_size": len(tokenizer),
    }
    vision_texts = tuple(t for t in texts.values() if t)
    return Processor(path.resolve(), processor, processor_files(path), fields, vision_texts)
