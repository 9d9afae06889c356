"""The parity measure of packed-row gradients (lab.parity) against their FP32 reference."""

from __future__ import annotations

import math

import pytest
import torch

from lab import parity


def _grads(**scale):
    names = {
        "decoder.layers.3.self_attention.linear_qkv.weight": "attention",
        "decoder.layers.0.self_attention.in_proj.weight": "gdn",
        "decoder.layers.0.mlp.experts.linear_fc1.weight0": "experts",
        "mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight": "mtp",
        "embedding.word_embeddings.weight": "rest",
    }
    torch.manual_seed(1)
    ref = {n: torch.randn(4, 4) for n in names}
    return ref, {n: t * scale.get(names[n], 1.0) for n, t in ref.items()}, names


def _record(case, path, grads, ref):
    return {"case": case, "path": path, "model": "m", "mtp": True, "grouped_gemm": True, **parity.compare(grads, ref)}


def test_compare_measures_each_part_against_the_reference():
    ref, grads, names = _grads(attention=1.5)
    for n, part in names.items():
        assert parity.part_of(n) == part
    r = parity.compare(grads, ref)
    assert r["max_rel_err"]["attention"] == pytest.approx(0.5) and r["max_rel_err"]["gdn"] == 0.0
    assert r["params"][0] == ("decoder.layers.3.self_attention.linear_qkv.weight", pytest.approx(0.5))
    assert r["ref_grad_norm"] == pytest.approx(math.sqrt(sum(float(t.pow(2).sum()) for t in ref.values())))
    ref, grads, _ = _grads()
    grads["decoder.layers.3.self_attention.linear_qkv.weight"][0, 0] = float("nan")
    broken = parity.compare(grads, ref)
    assert math.isnan(broken["max_rel_err"]["attention"]) and broken["max_rel_err"]["gdn"] == 0.0
    del grads["embedding.word_embeddings.weight"]
    assert parity.compare(grads, ref)["missing"] == ["embedding.word_embeddings.weight"]


def test_summary_holds_a_path_to_the_noise_floor_of_the_conversations_alone():
    ref, noise, _ = _grads(attention=1.01, gdn=1.01)
    _, good, _ = _grads(attention=1.02)
    _, bad, _ = _grads(attention=1.5)
    nan = {n: t * float("nan") for n, t in ref.items()}
    records = [
        _record("c", "alone", noise, ref),
        _record("c", parity.DEFAULT_PATH, good, ref),
        _record("c", "varlen", bad, ref),
        _record("c", "broken", nan, ref),
    ]
    cases = {c["path"]: c for c in parity.summarize(records)}
    assert set(cases) == {parity.DEFAULT_PATH, "varlen", "broken"}  # the noise path is the floor, not a case
    assert cases[parity.DEFAULT_PATH]["default_path"] and not cases["varlen"]["default_path"]
    assert cases[parity.DEFAULT_PATH]["noise_floor"] == pytest.approx(0.01, rel=1e-4)
    assert cases[parity.DEFAULT_PATH]["holds"] and not cases["varlen"]["holds"]
    assert cases["broken"]["grad_norm_ratio"] is None and not cases["broken"]["holds"]
    assert cases["broken"]["max_rel_err_attention"] is None and cases["broken"]["max_rel_err_gdn"] is None
    assert parity.summarize(records[1:]) == []  # no floor, no verdict
    lo, hi = parity.NORM_RATIO
    base = {"max_rel_err_attention": 0.01, "noise_floor": 0.01}
    assert parity.holds({**base, "grad_norm_ratio": lo}) and not parity.holds({**base, "grad_norm_ratio": hi + 1e-3})
