"""The offline catalog against the architecture table of the models' Hugging Face config.json files
(hf-configs in docs/sources.md)."""

import pytest

from bridge_recipes.models.qwen35 import SPECS, TEXT_SPECS, get_spec

# name: layers, hidden, dense ffn, heads, kv heads, GDN value heads, experts, top-k, expert ffn, shared ffn
TABLE = {
    "qwen35_27b": (64, 5120, 17408, 24, 4, 48, None, None, None, None),
    "qwen35_35b_a3b": (40, 2048, None, 16, 2, 32, 256, 8, 512, 512),
    "qwen35_122b_a10b": (48, 3072, None, 32, 2, 64, 256, 8, 1024, 1024),
    "qwen35_397b_a17b": (60, 4096, None, 32, 2, 64, 512, 10, 1024, 1024),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_text_spec_matches_reference_table(name):
    s = get_spec(name)
    got = (
        s.num_layers,
        s.hidden_size,
        s.ffn_hidden_size,
        s.num_attention_heads,
        s.num_query_groups,
        s.linear_num_value_heads,
        s.num_experts,
        s.moe_router_topk,
        s.moe_ffn_hidden_size,
        s.moe_shared_expert_ffn_hidden_size,
    )
    assert got == TABLE[name]
    assert (s.head_dim, s.linear_num_key_heads, s.linear_key_head_dim, s.linear_value_head_dim) == (256, 16, 128, 128)
    assert (s.linear_conv_kernel_dim, s.full_attention_interval, s.vocab_size) == (4, 4, 248320)
    assert (s.rope_theta, s.partial_rotary_factor, s.mtp_num_layers) == (1e7, 0.25, 1)


@pytest.mark.parametrize("spec", TEXT_SPECS, ids=lambda s: s.name)
def test_layer_pattern_is_three_gdn_then_attention(spec):
    pattern = spec.layer_pattern
    assert len(pattern) == spec.num_layers
    assert [i for i, t in enumerate(pattern) if t == 0] == list(range(3, spec.num_layers, 4))
    assert spec.num_gdn_layers == 3 * spec.num_attention_layers


def test_vl_variants_share_the_language_model_and_add_the_vision_tower():
    for text in TEXT_SPECS:
        vl = SPECS[text.name.replace("qwen35_", "qwen35_vl_")]
        assert vl.is_vl and not text.is_vl
        assert (vl.num_layers, vl.hidden_size, vl.num_experts) == (text.num_layers, text.hidden_size, text.num_experts)
        v = vl.vision
        assert (v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.patch_size, v.spatial_merge_size) == (
            27,
            1152,
            4304,
            16,
            16,
            2,
        )
        assert v.mrope_section == (11, 11, 10)
    assert len(SPECS) == 8


def test_checkpoints_carry_the_revisions_openrecipes_cites():
    assert get_spec("qwen35_35b_a3b").checkpoint("qwen3.6").revision == "995ad96eacd98c81ed38be0c5b274b04031597b0"
    assert get_spec("qwen35_27b").checkpoint("qwen3.6").revision == "6a9e13bd6fc8f0983b9b99948120bc37f49c13e9"
    assert get_spec("qwen35_397b_a17b").checkpoint().hf_id == "Qwen/Qwen3.5-397B-A17B"
    with pytest.raises(KeyError, match="qwen3.6"):
        get_spec("qwen35_397b_a17b").checkpoint("qwen3.6")


def test_unknown_model_suggests_the_nearest_name():
    with pytest.raises(KeyError, match="did you mean qwen35_35b_a3b"):
        get_spec("qwen35_35b_a3")
