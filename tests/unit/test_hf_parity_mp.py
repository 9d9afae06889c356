"""The two-GPU parity entry (bridge_recipes.hf.parity_mp) on CPU: its layout check, its exit
status on a bad layout, and the shape of its case (gated like the one-GPU cases)."""

from __future__ import annotations

import re

import pytest

from bridge_recipes.hf import parity_mp
from bridge_recipes.hf.parity import gated


def test_layout_must_divide_the_ranks():
    assert parity_mp.layout_problem(2, 1, 2) is None and parity_mp.layout_problem(1, 2, 2) is None
    assert re.search(r"--tp 4 --ep 1\b.*\b2 ranks\b", parity_mp.layout_problem(4, 1, 2))
    assert re.search(r"--tp 0 --ep 1\b.*\bat 1$", parity_mp.layout_problem(0, 1, 2))  # the smallest size


def test_a_bad_layout_exits_2_before_any_gpu_work(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert parity_mp.main(["ckpt", "hf", "out.json", "--tp", "3", "--name", "x"]) == 2
    assert re.search(r"--tp 3 --ep 1\b.*\b2 ranks\b", capsys.readouterr().err)


@pytest.mark.parametrize("kind, routing", [("dense", "dense"), ("moe", "all_experts")])
def test_cases_are_gated_like_the_one_gpu_cases(kind, routing):
    c = parity_mp.case("toy", kind, routing, 2, 1, 2, {"top1": 1.0, "rel_err": 1e-3})
    assert gated(c) and c["layout"].startswith("TP2 EP1 (2 GPUs)") and c["name"] == f"toy_fp32_{routing}"
