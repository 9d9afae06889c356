"""Fixtures shared by the unit tests of one subject: the tiny VL toy checkpoint."""

from __future__ import annotations

import pytest

from bridge_recipes.models.qwen35 import VisionSpec

# A VL MoE toy small enough for the CPU: its language model and vision tower a few thousand
# parameters wide, its processor the offline Qwen-VL one (Qwen3.5's patch geometry).
TINY_VL_SIZES = dict(
    hidden_size=64,
    num_attention_heads=2,
    num_query_groups=1,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    vocab_size=1024,
    num_experts=4,
    moe_router_topk=2,
    moe_ffn_hidden_size=32,
    moe_shared_expert_ffn_hidden_size=32,
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
