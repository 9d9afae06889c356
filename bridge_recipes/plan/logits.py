"""The loss's working set on the last pipeline stage: the logits and what each cross-entropy kernel
keeps of them (the terms are in ``bridge_recipes.plan.memory``'s docstring)."""

from __future__ import annotations

from typing import Any

from bridge_recipes.models.dims import ModelDims
from bridge_recipes.plan.dims import BF16, FP32, Tokens
from bridge_recipes.plan.layout import Layout
from bridge_recipes.plan.params import padded_vocab


def logits_elems(d: ModelDims, par: Layout, tok: Tokens) -> float:
    """L: one loss's logits on one rank, [seq / CP, vocab / TP] (the output layer gathers the
    sequence-parallel tokens)."""
    return tok.seq * padded_vocab(d, par) / par.tp


def cross_entropy_kind(cfg: Any) -> str:
    """The loss kernel: ``chunked`` (``features.chunked_loss``, where it applies), ``unfused``, ``te`` or
    ``native`` (the terms of :func:`logits_peak_bytes`)."""
    m = cfg.model
    if cfg.features.chunked_loss.applies_to(m):
        return "chunked"
    if not m.cross_entropy_loss_fusion:
        return "unfused"
    return "te" if getattr(m, "cross_entropy_fusion_impl", "native") == "te" else "native"


def logits_peak_bytes(d: ModelDims, par: Layout, tok: Tokens, kind: str, chunk_tokens: Any = None) -> float:
    """Peak of the loss computation: the MTP losses' kept tensors plus the LM loss's working
    set (the per-kind terms: ``bridge_recipes.plan.memory``'s docstring); ``chunk_tokens(vocab)``: the
    chunked loss's tokens per chunk (``features.chunked_loss``), for that kind."""
    L = logits_elems(d, par, tok)
    earlier = d.mtp_layers  # MTP losses are computed first and keep their backward tensors
    if kind == "chunked":  # one chunk's working set, and a few floats per token per loss
        vocab = L / tok.seq
        return min(tok.seq, chunk_tokens(int(vocab))) * vocab * 8 + (1 + earlier) * tok.seq * 3 * FP32
    if kind == "te":
        return L * (BF16 * earlier + BF16 + BF16)  # kept copies, BF16 logits + TE's saved copy
    kept = FP32 * earlier  # FP32 softmax per earlier loss
    working = BF16 + FP32 + (FP32 if kind == "native" else 0)  # logits, FP32 copy, compiled temporary
    return L * (kept + working)
