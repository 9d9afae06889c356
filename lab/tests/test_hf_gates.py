"""The Hugging Face evidence's verdicts on synthetic cases: parity gates and the LoRA arm's checks."""

from __future__ import annotations

from bridge_recipes.hf.parity import BATCH, SEQ, TOP1_MIN, cases_in_log, gate_failures, log_line
from lab.hf_evidence import lora_failures


def test_parity_positions_allow_the_gate_a_margin():
    """The parity run compares enough positions for the top-1 gate to allow a few disagreements."""
    assert BATCH * SEQ * (1 - TOP1_MIN) >= 4


def test_gate_failures_names_the_failing_case():
    good = {"model": "dense", "dtype": "fp32", "routing": "dense", "layout": "x", "top1": 1.0, "rel_err": 1e-3}
    moe = {**good, "model": "moe", "routing": "all_experts", "name": "m"}
    assert gate_failures([good, moe]) == []
    bad = {**moe, "rel_err": 2e-2}
    (failure,) = gate_failures([good, bad])
    assert failure.startswith("case m:") and "rel_err" in failure
    topk = {**moe, "routing": "topk", "name": "t", "top1": 0.5, "rel_err": 1.0}
    (failure,) = gate_failures([good, moe, topk])
    assert "case t" in failure and "expert_set_differs_share" in failure
    assert len(gate_failures([good])) == 1


def test_log_lines_round_trip():
    case = {"model": "moe", "dtype": "bf16", "routing": "topk", "top1": 0.8, "rel_err": 0.1}
    assert cases_in_log("noise\n[ 1.0s] " + log_line(case) + "\nmore") == [case]


def test_lora_failures_names_each_broken_check():
    from lab.hf_evidence import FINETUNE_STEPS

    passed = {
        "returncode": 0,
        "steps": FINETUNE_STEPS,
        "checkpoint_model_tensors": 48,
        "checkpoint_non_adapter_tensors": [],
        "export_vs_base": {"passed": True},
        "export_loads": True,
        "export_logits_max_abs_change": 0.1,
        "resume": {"passed": True, "resumed_returncode": 0},
    }
    assert lora_failures(passed) == []
    broken = {
        **passed,
        "checkpoint_non_adapter_tensors": ["decoder.layers.0.mlp.linear_fc1.weight"],
        "export_vs_base": {"passed": False},
        "resume": {"passed": False},
        "export_loads": False,
    }
    failures = lora_failures(broken)
    assert len(failures) == 4 and "linear_fc1" in failures[0]
    assert lora_failures({}) != []
