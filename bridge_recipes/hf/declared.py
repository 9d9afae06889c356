"""The tensors a Qwen3.5/3.6 ``config.json`` declares: their names, shapes and parts of the model.

A checkpoint's config states its model: decoder layers and which of them attend fully, widths,
heads, experts, MTP depth, the vision tower. Its weights must hold every tensor of that model, in
the shape the config gives and a floating-point dtype, and its index must list what its shards
hold; otherwise the conversion fails on the GPU machine, or worse, builds a tower transformers'
defaults fill. :func:`declared` derives the names and shapes (the names a released folder and
transformers' ``save_pretrained`` write; routed experts one tensor each, or stacked per layer as
some releases store them); :mod:`bridge_recipes.hf.weights_check` holds a folder's shard headers
against them and names quantized releases.

Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bridge_recipes.hf.released import MTP_PREFIX, VISION_PREFIX

LANGUAGE, MTP, VISION = "language model", "MTP layer", "vision tower"

# (value, what of the config it is): a dimension of a declared shape, None where the config lacks a field.
Dim = tuple[int | None, str]
Names = set[str] | Mapping[str, Any]  # a folder's tensor names (``in`` is all that is asked of them)


@dataclass(frozen=True)
class Tensor:
    """One declared tensor: the part of the model it belongs to, its shape, and whether it may be absent
    (a tied output layer) or stored with its trailing dimensions in either order (stacked experts)."""

    part: str
    shape: tuple[Dim, ...]
    optional: bool = False
    any_order: bool = False


class _Fields:
    """Whole-number fields of a config section, each with its name as a message shows it."""

    def __init__(self, holder: Mapping[str, Any], where: str, unknown: set[str] | None = None):
        self.holder, self.where = holder, where
        self.unknown = set() if unknown is None else unknown  # the fields asked for that the config lacks

    def __call__(self, name: str) -> Dim:
        v = self.holder.get(name)
        ok = isinstance(v, int) and not isinstance(v, bool)
        if not ok:
            self.unknown.add(f"{self.where}{name}")
        return (v if ok else None), f"{self.where}{name}"


def _mul(*dims: Dim | int) -> Dim:
    parts = [(d, str(d)) if isinstance(d, int) else d for d in dims]
    values = [v for v, _ in parts]
    value = None if any(v is None for v in values) else math.prod(v for v in values if v is not None)
    return value, " x ".join(label for _, label in parts)


def _add(a: Dim, b: Dim) -> Dim:
    value = None if a[0] is None or b[0] is None else a[0] + b[0]
    return value, f"{a[1]} + {b[1]}"


def _count(f: _Fields, name: str) -> int:
    """A count the config gives (layers, experts, blocks); 0 when absent or not a whole number >= 0."""
    v = f.holder.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def layer_types(text: Mapping[str, Any]) -> list[str]:
    """Each decoder layer's kind (``full_attention`` or ``linear_attention``): ``layer_types``, else every
    ``full_attention_interval``-th layer attends fully."""
    given = text.get("layer_types")
    if isinstance(given, list):
        return [str(t) for t in given]
    n, k = text.get("num_hidden_layers"), text.get("full_attention_interval")
    if not isinstance(n, int) or not isinstance(k, int) or k < 1:
        return []
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]


def _attention(p: str, f: _Fields) -> dict[str, tuple[Dim, ...]]:
    """A gated full-attention block: the query projection gives the gate as well."""
    h, hd = f("hidden_size"), f("head_dim")
    kv = _mul(f("num_key_value_heads"), hd)
    return {
        f"{p}self_attn.q_proj.weight": (_mul(2, f("num_attention_heads"), hd), h),
        f"{p}self_attn.k_proj.weight": (kv, h),
        f"{p}self_attn.v_proj.weight": (kv, h),
        f"{p}self_attn.o_proj.weight": (h, _mul(f("num_attention_heads"), hd)),
        f"{p}self_attn.q_norm.weight": (hd,),
        f"{p}self_attn.k_norm.weight": (hd,),
    }


def _linear_attention(p: str, f: _Fields) -> dict[str, tuple[Dim, ...]]:
    """A Gated DeltaNet block."""
    h, heads = f("hidden_size"), f("linear_num_value_heads")
    v = _mul(heads, f("linear_value_head_dim"))
    qkv = _add(_mul(2, f("linear_num_key_heads"), f("linear_key_head_dim")), v)
    return {
        f"{p}linear_attn.in_proj_qkv.weight": (qkv, h),
        f"{p}linear_attn.in_proj_z.weight": (v, h),
        f"{p}linear_attn.in_proj_a.weight": (heads, h),
        f"{p}linear_attn.in_proj_b.weight": (heads, h),
        f"{p}linear_attn.conv1d.weight": (qkv, (1, "1"), f("linear_conv_kernel_dim")),
        f"{p}linear_attn.A_log": (heads,),
        f"{p}linear_attn.dt_bias": (heads,),
        f"{p}linear_attn.norm.weight": (f("linear_value_head_dim"),),
        f"{p}linear_attn.out_proj.weight": (h, v),
    }


def _mlp(p: str, f: _Fields, moe: bool, packed: bool) -> tuple[dict[str, tuple[Dim, ...]], set[str]]:
    """The feed-forward block of a layer, and the names stored stacked (trailing dimensions in either order)."""
    h = f("hidden_size")
    if not moe:
        i = f("intermediate_size")
        return {f"{p}mlp.{n}_proj.weight": s for n, s in (("gate", (i, h)), ("up", (i, h)), ("down", (h, i)))}, set()
    e, i, shared = f("num_experts"), f("moe_intermediate_size"), f("shared_expert_intermediate_size")
    out: dict[str, tuple[Dim, ...]] = {
        f"{p}mlp.gate.weight": (e, h),
        f"{p}mlp.shared_expert.gate_proj.weight": (shared, h),
        f"{p}mlp.shared_expert.up_proj.weight": (shared, h),
        f"{p}mlp.shared_expert.down_proj.weight": (h, shared),
        f"{p}mlp.shared_expert_gate.weight": ((1, "1"), h),
    }
    if packed:
        stacked = {f"{p}mlp.experts.gate_up_proj": (e, _mul(2, i), h), f"{p}mlp.experts.down_proj": (e, h, i)}
        return out | stacked, set(stacked)
    for x in range(_count(f, "num_experts")):
        out[f"{p}mlp.experts.{x}.gate_proj.weight"] = (i, h)
        out[f"{p}mlp.experts.{x}.up_proj.weight"] = (i, h)
        out[f"{p}mlp.experts.{x}.down_proj.weight"] = (h, i)
    return out, set()


def _layer(p: str, kind: str, f: _Fields, moe: bool, names: Names) -> tuple[dict[str, tuple[Dim, ...]], set[str]]:
    h = f("hidden_size")
    out: dict[str, tuple[Dim, ...]] = {f"{p}input_layernorm.weight": (h,), f"{p}post_attention_layernorm.weight": (h,)}
    out |= _attention(p, f) if kind == "full_attention" else _linear_attention(p, f)
    packed = f"{p}mlp.experts.gate_up_proj" in names or f"{p}mlp.experts.down_proj" in names
    mlp, stacked = _mlp(p, f, moe, packed)
    return out | mlp, stacked


def _vision(v: _Fields) -> dict[str, tuple[Dim, ...]]:
    h, i, out = v("hidden_size"), v("intermediate_size"), v("out_hidden_size")
    merged = _mul(h, v("spatial_merge_size"), v("spatial_merge_size"))
    p = VISION_PREFIX
    shapes: dict[str, tuple[Dim, ...]] = {
        f"{p}patch_embed.proj.weight": (
            h,
            v("in_channels"),
            v("temporal_patch_size"),
            v("patch_size"),
            v("patch_size"),
        ),
        f"{p}patch_embed.proj.bias": (h,),
        f"{p}pos_embed.weight": (v("num_position_embeddings"), h),
        f"{p}merger.norm.weight": (h,),
        f"{p}merger.norm.bias": (h,),
        f"{p}merger.linear_fc1.weight": (merged, merged),
        f"{p}merger.linear_fc1.bias": (merged,),
        f"{p}merger.linear_fc2.weight": (out, merged),
        f"{p}merger.linear_fc2.bias": (out,),
    }
    for b in range(max(v("depth")[0] or 0, 0)):  # asked of the config: an absent depth is named
        q = f"{p}blocks.{b}."
        shapes |= {
            f"{q}attn.qkv.weight": (_mul(3, h), h),
            f"{q}attn.qkv.bias": (_mul(3, h),),
            f"{q}attn.proj.weight": (h, h),
            f"{q}attn.proj.bias": (h,),
            f"{q}mlp.linear_fc1.weight": (i, h),
            f"{q}mlp.linear_fc1.bias": (i,),
            f"{q}mlp.linear_fc2.weight": (h, i),
            f"{q}mlp.linear_fc2.bias": (h,),
        }
        shapes |= {f"{q}{n}.{w}": (h,) for n in ("norm1", "norm2") for w in ("weight", "bias")}
    return shapes


def declared_count(config: Mapping[str, Any], vl: bool, moe: bool) -> int:
    """About how many tensors :func:`declared` names (a bound checked before a damaged config's
    counts make it name millions)."""
    text, where, _ = sections(config, vl)
    f = _Fields(text, where)
    per_layer = 20 + (3 * _count(f, "num_experts") if moe else 0)
    vision = config.get("vision_config") if vl else None
    blocks = _count(_Fields(vision, ""), "depth") if isinstance(vision, Mapping) else 0
    return (len(layer_types(text)) + _count(f, "mtp_num_hidden_layers")) * per_layer + 12 * blocks + 20


def sections(config: Mapping[str, Any], vl: bool) -> tuple[Mapping[str, Any], str, str]:
    """(the language model's section, its name as messages show it, the prefix of its tensor names)."""
    if vl:
        return config.get("text_config") or {}, "text_config.", "model.language_model."
    return config, "", "model."


def declared(
    config: Mapping[str, Any], vl: bool, moe: bool, names: Names, unknown: set[str] | None = None
) -> dict[str, Tensor]:
    """Every tensor ``config`` declares, by name. ``names``: the folder's tensor names, which say per
    layer whether its routed experts are stored one by one or stacked. ``unknown`` gets the fields a
    shape follows that the config lacks (those dimensions are None)."""
    text, where, prefix = sections(config, vl)
    f = _Fields(text, where, unknown)
    h = f("hidden_size")
    out: dict[str, Tensor] = {}

    def add(shapes: Mapping[str, tuple[Dim, ...]], part: str, stacked: Iterable[str] = ()) -> None:
        either = set(stacked)
        for name, shape in shapes.items():
            out[name] = Tensor(part, shape, any_order=name in either)

    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    add({f"{prefix}embed_tokens.weight": (f("vocab_size"), h), f"{prefix}norm.weight": (h,)}, LANGUAGE)
    out["lm_head.weight"] = Tensor(LANGUAGE, (f("vocab_size"), h), optional=tied)
    for n, kind in enumerate(layer_types(text)):
        shapes, stacked = _layer(f"{prefix}layers.{n}.", kind, f, moe, names)
        add(shapes, LANGUAGE, stacked)
    depth = _count(f, "mtp_num_hidden_layers")
    for n in range(depth):
        shapes, stacked = _layer(f"{MTP_PREFIX}layers.{n}.", "full_attention", f, moe, names)
        add(shapes, MTP, stacked)
    if depth:
        add({f"{MTP_PREFIX}fc.weight": (h, _mul(2, h))}, MTP)
        add({f"{MTP_PREFIX}{n}.weight": (h,) for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}, MTP)
    vision = config.get("vision_config") if vl else None
    if isinstance(vision, Mapping):
        add(_vision(_Fields(vision, "vision_config.", f.unknown)), VISION)
    return out
