"""Every one-GPU recipe's summary says what its launch runs: the GEMM and base precision, the packed-attention
mode, the loss and the recompute the summary prints (after the launch's own changes) are those the run-time
patches install and the config hands to Megatron-Bridge."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import bridge_recipes
from bridge_recipes import features
from bridge_recipes.features import chunked_loss, packed_attention
from bridge_recipes.recipes import registry
from bridge_recipes.runner import checks, launch

ONE_GPU = sorted(
    n
    for n, e in registry.discover().items()
    if e.tree == "bridge_recipes" and e.meta.gpus == 1 and not e.alias_of and "_vl_" not in n
)
# the default packed-attention mode on each, and flash_varlen asked for on a GPU where it is proven
CASES = [(n, []) for n in ONE_GPU] + [
    ("qwen35_35b_a3b_peft_1gpu_h100_bf16_config", [f"{packed_attention.KEY}=flash_varlen"]),
    ("qwen35_27b_peft_1gpu_l40s_fp8base_config", ["features.fp8_base.gemms=fp8", f"{chunked_loss.KEY}=false"]),
]


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    """Rows with conversation boundaries, on which packed attention applies."""
    from bridge_recipes.config.fingerprint import boundaries_rows

    return boundaries_rows(tmp_path_factory.mktemp("rows") / "rows")


@pytest.fixture
def undone(monkeypatch):
    """The upstream symbols the launch's patches replace, put back after the test."""
    from megatron.bridge.models import model_provider
    from megatron.bridge.training import initialize
    from megatron.core import fp8_utils
    from megatron.core.extensions.transformer_engine import TEDotProductAttention

    for owner, name in (
        (TEDotProductAttention, "forward"),
        (initialize, "_warmup_jit_function"),
        (initialize, "compile_helpers"),
        (model_provider, "_create_model"),
        (fp8_utils, "get_fp8_recipe"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    for name, module in list(sys.modules.items()):  # Megatron's own: others may raise on getattr
        if name.split(".")[0] == "megatron" and getattr(module, "get_fp8_context", None) is fp8_utils.get_fp8_context:
            monkeypatch.setattr(module, "get_fp8_context", module.get_fp8_context)
    monkeypatch.setitem(packed_attention._state, "original", None)
    monkeypatch.setitem(packed_attention._state, "mode", packed_attention.DEFAULT_MODE)
    monkeypatch.setattr(features.te_wgrad.installed, "apex_grad_fusion_available", lambda: True)
    return fp8_utils


def _summary(text: str) -> dict[str, str]:
    return {line[:18].strip(): line[18:] for line in text.splitlines()}


@pytest.mark.parametrize(("name", "overrides"), CASES, ids=[f"{n}{'+' if o else ''}" for n, o in CASES])
def test_the_summary_and_the_launch_agree(name, overrides, rows, undone):
    fp8_utils = undone
    cfg = bridge_recipes.build(name, dataset="sft-rows", overrides=[f"dataset.path={rows}", *overrides])
    launch.prepare(cfg)  # what the machine changes comes before what is printed
    said = _summary(checks.summary(cfg, 1))
    features.apply(cfg)  # what the training process installs, from the same config

    # packed attention: the mode the patched forward routes by
    assert said["packed attention"].startswith(f"{packed_attention.mode()}:")
    # the loss: a chunk at a time exactly when its hook is on the model build
    hooked = chunked_loss.pre_wrap_hook in (getattr(cfg.model, "_pre_wrap_hooks", None) or [])
    assert said["loss"].startswith("a chunk of") == hooked
    # precision: an FP8 base's GEMMs in BF16 exactly when Megatron-Core's FP8 autocast is gone
    bf16_gemms = bool(getattr(fp8_utils.get_fp8_context, "without_autocast", False))
    assert ("BF16 GEMMs on the dequantized FP8 base" in said["precision"]) == bf16_gemms
    assert ("FP8 forward GEMMs" in said["precision"]) == (features.fp8_base.applies(cfg) and not bf16_gemms)
    assert ("FP8 base storage" in said["precision"]) == features.fp8_base.applies(cfg)
    # recompute: what the config hands to Megatron-Bridge, after every patch
    m = cfg.model
    assert (
        said["recompute"]
        == f"{m.recompute_granularity} {m.recompute_method or ''} {m.recompute_num_layers or ''}".strip()
    )
