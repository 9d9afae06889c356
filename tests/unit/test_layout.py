"""bridge_recipes.plan.layout: the one definition of the parallel layout rules."""

import re
from types import SimpleNamespace

import pytest

from bridge_recipes.plan.layout import Layout, layout_of, stage_layers


def _cfg(**model):
    base = dict(
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        context_parallel_size=2,
        expert_model_parallel_size=4,
        expert_tensor_parallel_size=None,
        virtual_pipeline_model_parallel_size=None,
        sequence_parallel=True,
        num_layers=8,
        num_moe_experts=256,
    )
    return SimpleNamespace(model=SimpleNamespace(**{**base, **model}))


def test_layout_of_a_config():
    lay = layout_of(_cfg(), 16)
    assert (lay.tp, lay.pp, lay.cp, lay.ep, lay.dp, lay.world, lay.sp) == (2, 2, 2, 4, 2, 16, True)
    assert lay.model_parallel == 8 and lay.dense_dp == 4
    assert lay.expert_tp == 2  # unset expert TP follows TP
    assert lay.expert_dp == 16 // (2 * 4 * 2)
    assert layout_of(_cfg(expert_tensor_parallel_size=1), 16).expert_tp == 1
    assert layout_of(_cfg(), 12).dp is None  # 12 GPUs do not divide into TP x PP x CP = 8


def test_labels():
    lay = layout_of(_cfg(expert_tensor_parallel_size=1), 16)
    assert lay.label() == "TP2 PP2 CP2 EP4 ETP1 DP2"
    assert lay.label(show_sp=True) == "TP2 SP PP2 CP2 EP4 ETP1 DP2"
    assert Layout(tp=1, pp=4, cp=1, ep=1, etp=None, vpp=2, dp=None, world=6).label() == "TP1 PP4 VPP2 DP?"
    # experts split by TP alone (EP1 ETP2) are shown; a dense model has no expert sizes to show
    assert layout_of(_cfg(expert_model_parallel_size=1, expert_tensor_parallel_size=1), 8).label() == (
        "TP2 PP2 CP2 EP1 ETP1 DP1"
    )
    assert layout_of(_cfg(expert_model_parallel_size=1), 8).label() == "TP2 PP2 CP2 DP1"
    assert layout_of(_cfg(num_moe_experts=None, expert_tensor_parallel_size=1), 8).label() == "TP2 PP2 CP2 DP1"


@pytest.mark.parametrize(
    "first, last, expected",
    [(None, None, [4, 4]), (3, None, [3, 5]), (None, 6, [2, 6]), (3, 6, None)],
)
def test_stage_layers(first, last, expected):
    cfg = _cfg(num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last)
    assert stage_layers(cfg) == expected


def test_rule_problems_name_each_broken_rule():
    from bridge_recipes.plan.layout import ModelShape, rule_problems

    moe = ModelShape(heads=(("attention heads", 16), ("GDN value heads", 32)), experts=256, seq_length=8192)
    ok = Layout(tp=2, pp=2, cp=2, ep=4, etp=1, vpp=2, dp=2, world=16, sp=True)
    assert rule_problems(moe, ok, [4, 4]) == []
    bad = Layout(tp=3, pp=1, cp=3, ep=7, etp=1, vpp=2, dp=None, world=16, sp=False)
    found = " | ".join(rule_problems(moe, bad, [8]))
    for expected in (
        "world size 16 is not divisible by TP x PP x CP = 3 x 1 x 3",
        "virtual pipeline stages need PP > 1",
        "attention heads = 16 is not divisible by TP=3",
        "256 experts are not divisible by EP=7",
        "sequence length 8192 is not divisible by 2 x CP = 6",
        "TP > 1 with MoE needs sequence parallelism",
    ):
        assert expected in found, expected
    dense = ModelShape(heads=(), experts=None, seq_length=8192)
    assert rule_problems(dense, Layout(tp=1, pp=1, cp=1, ep=2, etp=1, vpp=None, dp=2, world=2), None) == [
        "EP=2 on a dense model: set -ep 1"
    ]
    tile = Layout(tp=1, pp=1, cp=1, ep=4, etp=2, vpp=None, dp=4, world=4)
    (msg,) = rule_problems(moe, tile, None)
    assert re.search(r"EP x ETP = 4 x 2 .*TP x CP x DP = 1 x 1 x 4\b", msg) and "-ep/-etp" in msg, msg
