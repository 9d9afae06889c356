"""Fixtures shared by the unit tests of one subject: the tiny VL toy checkpoint."""

from __future__ import annotations

import pytest

from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES
from bridge_recipes.models.qwen35 import VisionSpec

# A VL MoE toy small enough for the CPU: its language model and vision tower a few thousand
# parameters wide, its processor the offline Qwen-VL one (Qwen3.5's patch geometry).
TINY_VL_SIZES = dict(
    **CPU_SIZES,
    **CPU_MOE_SIZES,
    vision=VisionSpec(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, num_position_embeddings=64),
)


@pytest.fixture(scope="session")
def tiny_vl_toy(tmp_path_factory):
    """(folder, spec) of a tiny FP32 VL toy: weights, the offline Qwen-VL processor, its vision token
    ids in config.json. Read-only for the tests that share it."""
    from bridge_recipes.hf.toy import make_toy

    folder = tmp_path_factory.mktemp("tiny_vl_toy") / "vl"
    spec = make_toy(folder, "moe", vl=True, dtype="float32", max_shard_size="300KB", **TINY_VL_SIZES)
    return folder, spec
