"""Small random-weight Hugging Face checkpoints of the Qwen3.5 family, made offline with
transformers' own classes, for conversion tests and parity runs.

A toy is a catalog spec scaled down (:func:`toy_spec`): the family fields stay those of the
recipe's model (full-attention interval, head dimensions, GDN head dimensions, convolution
width, rotary fraction), the size fields shrink. It is saved with ``save_pretrained`` (sharded,
with the index) next to a small byte-level BPE tokenizer, so that Megatron-Bridge's
``save_hf_pretrained`` finds tokenizer files in the source folder. A VL toy without a given
tokenizer ships the offline Qwen-VL processor (:mod:`bridge_recipes.vl.offline_vl_processor`)
instead, its config's vision token ids pointing at that processor's tokens: the folder is then a
whole VL checkpoint (weights, tokenizer, chat template, image processor), as a released one is.
``mtp_num_layers=1`` adds the MTP layer a released folder carries (:func:`add_mtp_weights`):
``convert_checkpoint.py toy`` makes that released form (VL with MTP) unless ``--text-only``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from bridge_recipes.models.qwen35 import QWEN35_27B, QWEN35_35B_A3B, Qwen35Spec, VisionSpec, get_spec, vl_variant

# Sizes of the GPU parity toys: 4 layers (3 Gated DeltaNet + 1 gated attention, the real
# pattern), hidden 512, 16 experts, a vocabulary of 8,192 (above the toy tokenizer's 1,024:
# Megatron pads nothing and the extra rows are never looked up). No MTP layer unless asked
# (``mtp_num_layers=1``, the released form): transformers' classes neither build nor save one,
# so :func:`add_mtp_weights` writes it.
TOY_SIZES: dict[str, Any] = dict(
    num_layers=4,
    hidden_size=512,
    num_attention_heads=8,
    num_query_groups=2,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    vocab_size=8192,
    mtp_num_layers=0,
    max_position_embeddings=4096,
)
TOY_MOE_SIZES: dict[str, Any] = dict(
    num_experts=16,
    moe_router_topk=4,
    moe_ffn_hidden_size=256,
    moe_shared_expert_ffn_hidden_size=256,
)
TOY_DENSE_SIZES: dict[str, Any] = dict(ffn_hidden_size=1024)
TOY_VISION = VisionSpec(depth=2, hidden_size=128, intermediate_size=256, num_heads=2, num_position_embeddings=256)

FAMILIES = {"dense": QWEN35_27B, "moe": QWEN35_35B_A3B}
TOKENIZER_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_TEXT = (
    "Qwen3.5 toy checkpoints carry a small byte-level tokenizer so that conversions find tokenizer files. "
    "The quick brown fox jumps over the lazy dog. 0123456789 <think> </think> user assistant system\n"
)


# The sizes of a toy small enough for a CPU (a few thousand parameters wide): make_toy(..., **CPU_SIZES)
# for either family, with CPU_MOE_SIZES added for the MoE one.
CPU_SIZES: dict[str, Any] = dict(
    hidden_size=64,
    num_attention_heads=2,
    num_query_groups=1,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    vocab_size=1024,
)
CPU_MOE_SIZES: dict[str, Any] = dict(
    num_experts=4,
    moe_router_topk=2,
    moe_ffn_hidden_size=32,
    moe_shared_expert_ffn_hidden_size=32,
)


def toy_spec(family: str = "moe", vl: bool = False, **sizes: Any) -> Qwen35Spec:
    """The catalog spec of ``family`` (dense: 27B, moe: 35B-A3B) scaled to the toy sizes;
    ``sizes`` override single fields (e.g. ``hidden_size=64`` for CPU tests)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown toy family {family!r}; choose one of {', '.join(FAMILIES)}")
    base = FAMILIES[family]
    fields = {**TOY_SIZES, **(TOY_MOE_SIZES if base.is_moe else TOY_DENSE_SIZES), **sizes}
    spec = replace(base, name=f"toy_{base.name}", **fields)
    return replace(vl_variant(spec), vision=sizes.get("vision", TOY_VISION)) if vl else spec


def real_width_sizes(family: str) -> dict[str, Any]:
    """The catalog model's own widths (hidden size, heads, Gated DeltaNet heads, experts and their
    width, dense FFN, vocabulary) at 4 layers and no MTP: a toy whose every matrix has the shape of
    the released checkpoint's, so a conversion is checked at the real tensor shapes."""
    base = FAMILIES[family]
    names = ["hidden_size", "num_attention_heads", "num_query_groups", "linear_num_key_heads"]
    names += ["linear_num_value_heads", "vocab_size"]
    names += list(TOY_MOE_SIZES) if base.is_moe else list(TOY_DENSE_SIZES)
    return {**{n: getattr(base, n) for n in names}, "num_layers": 4, "mtp_num_layers": 0}


def recipe_spec_of(toy: Qwen35Spec) -> Qwen35Spec:
    """The catalog spec a toy was scaled from."""
    return get_spec(toy.name.removeprefix("toy_"))


def save_tokenizer(out: str | Path, tokenizer_json: str | Path | None = None) -> None:
    """tokenizer.json + tokenizer_config.json in ``out``: a copy of ``tokenizer_json`` or a byte BPE
    of 1,024 tokens trained here (deterministic) on a fixed text. A ``chat_template.jinja`` beside
    ``tokenizer_json`` is copied too (the fixture tokenizer's Qwen3.5-style template), so rows can
    be built from the toy folder with its own template."""
    from transformers import PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_json is None:
        from bridge_recipes.vl.byte_bpe import train_byte_bpe

        train_byte_bpe([TOKENIZER_TEXT] * 4, TOKENIZER_SPECIALS, 1024).save(str(out / "tokenizer.json"))
    else:
        shutil.copyfile(tokenizer_json, out / "tokenizer.json")
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(out / "tokenizer.json"), eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tok.save_pretrained(str(out))
    if tokenizer_json is not None:
        # save_pretrained re-serializes tokenizer.json; the given file's own bytes keep the rows
        # built with it usable (their manifest pins its sha256)
        shutil.copyfile(tokenizer_json, out / "tokenizer.json")
        template = Path(tokenizer_json).parent / "chat_template.jinja"
        if template.is_file():
            shutil.copyfile(template, out / "chat_template.jinja")


def make_toy(
    out: str | Path,
    family: str = "moe",
    *,
    vl: bool = False,
    seed: int = 0,
    dtype: str = "bfloat16",
    max_shard_size: str = "20MB",
    tokenizer_json: str | Path | None = None,
    **sizes: Any,
) -> Qwen35Spec:
    """Save a random-init toy checkpoint of ``family`` to ``out``; returns its spec."""
    import torch

    from bridge_recipes.models.qwen35 import hf_config

    spec = toy_spec(family, vl, **sizes)
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the released vocabulary's BOS/EOS ids, replaced below, are out of the toy's
    try:
        config = hf_config(spec)
    finally:
        hf_logging.set_verbosity(level)
    out = Path(out)
    with_processor = vl and tokenizer_json is None
    if with_processor:
        from bridge_recipes.vl.offline_vl_processor import build, vision_token_ids

        build(out)
        for name, value in vision_token_ids(out).items():
            if hasattr(config, name):
                setattr(config, name, value)
    # Every sub-config too: Megatron-Bridge builds a VL model's parameters in its text config's
    # dtype, which otherwise stays transformers' default (BF16) under an FP32 top-level config.
    # A torch.dtype, not its name: on a GPU with flash-linear-attention installed, transformers
    # 5.12 builds the Gated DeltaNet's fused gated norm with config.dtype as given, and
    # torch.empty refuses a string.
    for c in (config, getattr(config, "text_config", None), getattr(config, "vision_config", None)):
        if c is not None:
            c.dtype = getattr(torch, dtype)
    # BOS/EOS of the toy tokenizer (<|endoftext|> is id 0), not the released vocabulary's ids.
    for c in (config, getattr(config, "text_config", None)):
        if c is not None:
            c.bos_token_id, c.eos_token_id, c.pad_token_id = None, 0, 0
    if vl:
        from transformers import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration

        cls = Qwen3_5MoeForConditionalGeneration if spec.is_moe else Qwen3_5ForConditionalGeneration
    else:
        from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

        cls = Qwen3_5MoeForCausalLM if spec.is_moe else Qwen3_5ForCausalLM
    torch.manual_seed(seed)
    model = cls(config).to(getattr(torch, dtype))
    model.save_pretrained(str(out), max_shard_size=max_shard_size)
    if spec.mtp_num_layers:
        add_mtp_weights(out, spec.mtp_num_layers, seed=seed)
    if not with_processor:
        save_tokenizer(out, tokenizer_json)
    meta = {
        "toy_of": recipe_spec_of(spec).name,
        "family": family,
        "vl": vl,
        "mtp_layers": spec.mtp_num_layers,
        "seed": seed,
    }
    if with_processor:
        meta["processor"] = "bridge_recipes.vl.offline_vl_processor"
    (out / "toy.json").write_text(json.dumps(meta, indent=1) + "\n")
    return spec


MTP_FILE = "model-mtp.safetensors"


def add_mtp_weights(out: str | Path, layers: int, *, seed: int = 0) -> None:
    """Add random MTP weights (``mtp.*``, named as a released checkpoint names them) to the toy
    saved in ``out``, whose config already declares ``layers`` MTP layers: transformers' classes
    neither build nor save the MTP layer, which a released folder carries. Each MTP layer has the
    tensors of the model's full-attention decoder layer, plus the projection of [embedding;
    hidden] and three norms; they go into their own shard, listed in the index."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    out = Path(out)
    config = json.loads((out / "config.json").read_text())
    text = config.get("text_config") or config
    prefix = "model.language_model.layers." if "text_config" in config else "model.layers."
    full = text["layer_types"].index("full_attention")
    index_file = out / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map = json.loads(index_file.read_text())["weight_map"]
    else:
        with safe_open(str(out / "model.safetensors"), framework="pt") as f:
            weight_map = {name: "model.safetensors" for name in f.keys()}
    generator = torch.Generator().manual_seed(seed + 1)
    hidden = text["hidden_size"]
    layer = f"{prefix}{full}."
    tensors: dict[str, torch.Tensor] = {}
    for name, file in sorted(weight_map.items()):
        if name.startswith(layer):
            with safe_open(str(out / file), framework="pt") as f:
                like = f.get_tensor(name)
            for i in range(layers):
                tensors[f"mtp.layers.{i}.{name[len(layer) :]}"] = _random_like(like, generator)
    like = tensors["mtp.layers.0.input_layernorm.weight"]
    tensors["mtp.fc.weight"] = _random_like(like.new_empty(hidden, 2 * hidden), generator)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = _random_like(like, generator)
    save_file(tensors, str(out / MTP_FILE), metadata={"format": "pt"})
    weight_map.update({name: MTP_FILE for name in tensors})
    total = sum((out / f).stat().st_size for f in set(weight_map.values()))
    index_file.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")


def _random_like(like, generator):
    import torch

    return (torch.randn(like.shape, generator=generator, dtype=torch.float32) * 0.02).to(like.dtype)


def model_overrides(spec: Qwen35Spec) -> list[str]:
    """``model.*`` overrides that make a recipe of ``spec``'s catalog model (after ``--scale-down
    LAYERS --scale-experts N``) build the toy's architecture, so its weights load (a VL toy's
    vision tower included)."""
    out = [
        f"model.hidden_size={spec.hidden_size}",
        f"model.num_attention_heads={spec.num_attention_heads}",
        f"model.num_query_groups={spec.num_query_groups}",
        f"model.kv_channels={spec.head_dim}",
        f"model.linear_num_key_heads={spec.linear_num_key_heads}",
        f"model.linear_num_value_heads={spec.linear_num_value_heads}",
        f"model.vocab_size={spec.vocab_size}",
        f"model.mtp_num_layers={spec.mtp_num_layers or 'null'}",
    ]
    if spec.is_moe:
        out += [
            f"model.moe_router_topk={spec.moe_router_topk}",
            f"model.moe_ffn_hidden_size={spec.moe_ffn_hidden_size}",
            f"model.moe_shared_expert_intermediate_size={spec.moe_shared_expert_ffn_hidden_size}",
        ]
    else:
        out.append(f"model.ffn_hidden_size={spec.ffn_hidden_size}")
    if spec.vision is not None:
        v = spec.vision
        out += [
            f"model.vision_config.depth={v.depth}",
            f"model.vision_config.hidden_size={v.hidden_size}",
            f"model.vision_config.intermediate_size={v.intermediate_size}",
            f"model.vision_config.num_heads={v.num_heads}",
            f"model.vision_config.num_position_embeddings={v.num_position_embeddings}",
            f"model.vision_config.out_hidden_size={spec.hidden_size}",
        ]
    return out
