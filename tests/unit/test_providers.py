"""Providers build offline from the catalog and pass Megatron-Core's TransformerConfig checks."""

import pytest
import torch

from bridge_recipes.models.qwen35 import SPECS, build_provider, get_spec


@pytest.mark.parametrize("name", sorted(SPECS))
def test_provider_builds_and_validates(name):
    spec = get_spec(name)
    p = build_provider(spec, expert_model_parallel_size=8 if spec.is_moe else 1, gradient_accumulation_fusion=False)
    p.finalize()  # Megatron-Core TransformerConfig.__post_init__ validation
    assert p.num_layers == spec.num_layers and p.hidden_size == spec.hidden_size
    assert p.experimental_attention_variant == "gated_delta_net"
    assert list(p.linear_attention_freq) == spec.layer_pattern
    assert p.attention_output_gate and p.qk_layernorm and p.layernorm_zero_centered_gamma
    assert p.normalization == "RMSNorm" and p.gated_linear_unit
    assert p.activation_func is torch.nn.functional.silu  # the GDN layer asserts silu
    assert (p.num_query_groups, p.kv_channels) == (spec.num_query_groups, 256)
    assert (p.rotary_base, p.rotary_percent) == (1e7, 0.25)
    assert p.mtp_num_layers == 1 and p.mtp_loss_scaling_factor == 0.1
    assert p.share_embeddings_and_output_weights is False
    assert p.bf16 and p.params_dtype == torch.bfloat16
    assert p.transformer_layer_spec.__name__ == "get_transformer_block_with_experimental_attention_variant_spec"
    if spec.is_moe:
        assert (p.num_moe_experts, p.moe_router_topk) == (spec.num_experts, spec.moe_router_topk)
        assert p.moe_shared_expert_gate and p.moe_grouped_gemm
        assert p.moe_shared_expert_intermediate_size == spec.moe_shared_expert_ffn_hidden_size
        assert p.moe_router_load_balancing_type == "global_aux_loss" and p.moe_router_pre_softmax is False
    else:
        assert p.num_moe_experts is None and p.ffn_hidden_size == spec.ffn_hidden_size
    if spec.is_vl:
        assert p.position_embedding_type == "mrope" and list(p.mrope_section) == [11, 11, 10]
        assert p.vision_config.depth == 27 and p.vision_config.out_hidden_size == spec.hidden_size
        assert p.image_token_id == 248056 and p.eos_token_id == 248044
    else:
        assert p.position_embedding_type == "rope" and p.eos_token_id == 248046


def test_unknown_override_is_an_error():
    with pytest.raises(AttributeError, match="no field 'tensor_parallel'"):
        build_provider("qwen35_27b", tensor_parallel=2)
