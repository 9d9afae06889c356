"""Parameter counts: OpenRecipes' N exactly, nominal sizes, and agreement with the HF modules."""

import pytest
import torch

from bridge_recipes.models.params import count_parameters
from bridge_recipes.models.qwen35 import get_spec, hf_config, hf_text_config


def test_active_matmul_count_reproduces_openrecipes_exactly():
    # openrecipes-35b-h200 (35B-A3B) and openrecipes-27b-h200 (27B): "N = ... active parameters per token"
    assert count_parameters(get_spec("qwen35_35b_a3b")).matmul_active == 2_946_252_800
    assert count_parameters(get_spec("qwen35_27b")).matmul_active == 25_623_920_640


# nominal (total B, active B) of the model names; totals without the MTP head, which HF's
# parameter count (the name) does not include
NOMINAL = {
    "qwen35_27b": (27, 27),
    "qwen35_35b_a3b": (35, 3),
    "qwen35_122b_a10b": (122, 10),
    "qwen35_397b_a17b": (397, 17),
}


@pytest.mark.parametrize("name", sorted(NOMINAL))
def test_nominal_sizes(name):
    c = count_parameters(get_spec(name))
    total_b = (c.total - c.mtp_total) / 1e9
    active_b = c.matmul_active / 1e9
    want_total, want_active = NOMINAL[name]
    assert abs(total_b - want_total) / want_total < 0.03, total_b
    assert abs(active_b - want_active) / want_active < 0.12, active_b
    assert c.active <= c.total


def _hf_model_params(module_cls, config) -> int:
    with torch.device("meta"):
        model = module_cls._from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["qwen35_27b", "qwen35_35b_a3b", "qwen35_397b_a17b"])
def test_counter_equals_the_hf_module_parameter_count(name):
    """The HF causal-LM module (no MTP head) built on the meta device from the catalog config."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    spec = get_spec(name)
    cls = Qwen3_5MoeForCausalLM if spec.is_moe else Qwen3_5ForCausalLM
    c = count_parameters(spec)
    assert _hf_model_params(cls, hf_text_config(spec)) == c.total - c.mtp_total


def test_vision_tower_count_equals_the_hf_module():
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeVisionModel

    spec = get_spec("qwen35_vl_35b_a3b")
    assert _hf_model_params(Qwen3_5MoeVisionModel, hf_config(spec).vision_config) == count_parameters(spec).vision


def test_dense_model_active_equals_total():
    c = count_parameters(get_spec("qwen35_27b"))
    assert c.active == c.total
