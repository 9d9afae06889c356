"""The GB300 SFT recipes of the large text models take the parallel layout and dispatcher of
Megatron-Bridge's GB300 benchmarks for the same backbones (read from the installed 0.6.2's source,
which builds VL models), and plan to fit with the margin their docstrings state."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import bridge_recipes
from bridge_recipes.plan.memory import plan_memory

PAIRS = [
    (
        "qwen35_122b_a10b_sft_32gpu_gb300_bf16_config",
        "qwen35_vl_122b_a10b_pretrain_32gpu_gb300_bf16_config",
        32,
        290.0,
    ),
    (
        "qwen35_397b_a17b_sft_64gpu_gb300_bf16_config",
        "qwen35_vl_397b_a17b_pretrain_64gpu_gb300_bf16_config",
        64,
        293.4,
    ),
]
FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "sequence_parallel",
    "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend",
)


def published_model_settings(function: str) -> dict:
    """``cfg.model.NAME = LITERAL`` assignments in the installed benchmark function."""
    spec = importlib.util.find_spec("megatron.bridge.perf_recipes.qwen_vl.gb300.qwen35_vl")
    tree = ast.parse(Path(spec.origin).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    out = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            target = node.targets[0]
            if ast.unparse(target.value) == "cfg.model" and isinstance(node.value, ast.Constant):
                out[target.attr] = node.value.value
    return out


@pytest.mark.parametrize(("name", "published", "gpus", "peak"), PAIRS)
def test_layout_is_the_published_benchmarks(name, published, gpus, peak):
    cfg = bridge_recipes.build(name)
    settings = published_model_settings(published)
    assert {f: getattr(cfg.model, f) for f in FIELDS} == {f: settings[f] for f in FIELDS}
    assert (
        cfg.model.expert_model_parallel_size == gpus
        and cfg.env_vars["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == gpus
    )
    plan = plan_memory(cfg, gpus, gpu="gb300")
    assert plan.fits and round(plan.peak_gb, 1) == peak
    assert cfg.train.global_batch_size == 128 and cfg.model.seq_length == 8192 and cfg.train.micro_batch_size == 1


def test_the_397b_recompute_is_the_fewest_layers_with_a_margin():
    """Block recompute of 40 of 60 layers keeps a 5% margin; 30 does not fit at all."""
    over = bridge_recipes.build(
        "qwen35_397b_a17b_sft_64gpu_gb300_bf16_config", overrides=["model.recompute_num_layers=30"]
    )
    plan = plan_memory(over, 64, gpu="gb300")
    assert not plan.fits and round(plan.peak_gb, 1) == 328.3
