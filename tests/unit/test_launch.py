"""Hand-off to Megatron-Bridge: what the launch changes (before it prints what runs), forward step, entry
point."""

import contextlib
import importlib.util
import re
from types import SimpleNamespace

import pytest

from bridge_recipes.features import te_wgrad as te_wgrad_patch  # the feature module holds its patch too
from bridge_recipes.patches import dataset_helpers, warmup_rng
from bridge_recipes.runner import launch


@pytest.fixture
def smoke():
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config

    return qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config()


def test_helper_compile_is_skipped_for_the_wheel(monkeypatch):
    import megatron.bridge.training.initialize as init

    monkeypatch.setattr(init, "compile_helpers", lambda: pytest.fail("make ran"))
    assert dataset_helpers.prebuilt()  # this install: compiled module, no Makefile
    assert dataset_helpers.wanted()
    assert "dataset helpers" in dataset_helpers.install()
    init.compile_helpers()  # now a no-op instead of running make


def test_helper_compile_is_kept_where_a_makefile_exists(tmp_path, monkeypatch):
    (tmp_path / "Makefile").write_text("all:\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            SimpleNamespace(submodule_search_locations=[str(tmp_path)])
            if name == "megatron.core.datasets"
            else real(name, *a)
        ),
    )
    assert not dataset_helpers.prebuilt() and not dataset_helpers.wanted()


def test_grad_fusion_kept_without_apex_through_transformer_engine(smoke, monkeypatch):
    import sys

    from megatron.core.tensor_parallel import layers

    from bridge_recipes.features import te_wgrad

    smoke.model.gradient_accumulation_fusion = True
    smoke.model.defer_embedding_wgrad_compute = True
    monkeypatch.setattr(te_wgrad_patch.installed, "apex_grad_fusion_available", lambda: False)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    monkeypatch.delattr(layers, "fused_weight_gradient_mlp_cuda", raising=False)
    monkeypatch.setattr(te_wgrad, "self_check", lambda: None)
    assert te_wgrad_patch.wanted(smoke)
    change = te_wgrad.launch_change(smoke)  # fusion stays; only the deferred embedding gradient goes off
    assert change is not None and change.startswith("defer_embedding_wgrad_compute: off")
    assert "gradient_accumulation_fusion: on" in te_wgrad_patch.install(smoke)
    assert smoke.model.gradient_accumulation_fusion is True
    assert smoke.model.defer_embedding_wgrad_compute is False  # its drain imports APEX's module by name
    # Megatron-Core's own linear layers call the stand-in's functions where they call APEX's kernel
    assert layers._grad_accum_fusion_available
    assert layers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32 is te_wgrad.wgrad_gemm_accum_fp32
    # nothing stands in for APEX's module in the import system
    assert te_wgrad.APEX_MODULE not in sys.modules
    # the stand-in is not APEX: the probe still says so (the export's model build turns fusion off)
    from bridge_recipes.hardware.installed import apex_grad_fusion_available

    assert not apex_grad_fusion_available()


def test_grad_fusion_off_when_the_stand_in_fails_its_check(smoke, monkeypatch):
    from bridge_recipes.features import te_wgrad

    smoke.model.gradient_accumulation_fusion = True
    monkeypatch.setattr(te_wgrad_patch.installed, "apex_grad_fusion_available", lambda: False)
    monkeypatch.setattr(te_wgrad, "self_check", lambda: "Transformer Engine's GEMM failed (RuntimeError: x)")
    monkeypatch.setattr(te_wgrad_patch, "serve_as_apex", lambda: pytest.fail("installed after a failed check"))
    assert te_wgrad_patch.wanted(smoke)
    with pytest.raises(RuntimeError, match="turns it off first"):
        te_wgrad_patch.install(smoke)  # the launch changes the config before it prints what runs
    (out,) = [c for c in launch.prepare(smoke) if c.startswith("gradient_accumulation_fusion")]
    assert smoke.model.gradient_accumulation_fusion is False and not te_wgrad_patch.wanted(smoke)
    assert "gradient_accumulation_fusion: off" in out and "(RuntimeError: x)" in out  # the check's reason
    assert launch.prepare(smoke) == []  # said once


def test_grad_fusion_off_when_its_feature_is(smoke, monkeypatch):
    from bridge_recipes.features import te_wgrad

    smoke.model.gradient_accumulation_fusion = True
    smoke.features.te_wgrad.enabled = False
    monkeypatch.setattr(te_wgrad_patch.installed, "apex_grad_fusion_available", lambda: False)
    monkeypatch.setattr(te_wgrad, "self_check", lambda: pytest.fail("checked a stand-in that is switched off"))
    assert te_wgrad.KEY in te_wgrad.launch_change(smoke) and smoke.model.gradient_accumulation_fusion is False


def test_the_self_check_passes_on_a_machine_without_a_gpu_and_judges_the_gemm(monkeypatch):
    """No GPU: nothing to check. With one, a GEMM that raises or accumulates wrong fails the check (the
    check's own arithmetic run here on the CPU, the device faked)."""
    import torch

    from bridge_recipes.features import te_wgrad

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert te_wgrad.self_check() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "device", lambda *a, **k: "cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch, "Generator", lambda device=None: torch._C.Generator())

    def right(x, dy, g):
        g += dy.float().t() @ x.float()

    monkeypatch.setattr(te_wgrad, "wgrad_gemm_accum_fp32", right)
    assert te_wgrad.self_check() is None
    monkeypatch.setattr(te_wgrad, "wgrad_gemm_accum_fp32", lambda x, dy, g: g.mul_(2))
    problem = te_wgrad.self_check()
    assert "FP32 reference" in problem and f"tolerance {te_wgrad.SELF_CHECK_TOLERANCE}" in problem

    def broken(*a):
        raise RuntimeError("no cuBLAS")

    monkeypatch.setattr(te_wgrad, "wgrad_gemm_accum_fp32", broken)
    problem = te_wgrad.self_check()
    assert "GEMM" in problem and "RuntimeError: no cuBLAS" in problem


def test_grad_fusion_left_alone_with_apex_or_when_off(smoke, monkeypatch):
    smoke.model.gradient_accumulation_fusion = True
    monkeypatch.setattr(te_wgrad_patch.installed, "apex_grad_fusion_available", lambda: True)
    assert not te_wgrad_patch.wanted(smoke)
    assert smoke.model.gradient_accumulation_fusion is True
    smoke.model.gradient_accumulation_fusion = False
    monkeypatch.setattr(te_wgrad_patch.installed, "apex_grad_fusion_available", lambda: False)
    assert not te_wgrad_patch.wanted(smoke)
    assert smoke.model.gradient_accumulation_fusion is False


def test_the_stand_in_makes_transformer_engines_fused_wgrad_call(monkeypatch):
    """The stand-in's GEMM is the one Transformer Engine's linear layers make for a fused weight gradient:
    x and dy in, layout NT, accumulating into main_grad in its dtype (the numerics run on the GPU:
    tests/gpu/test_te_wgrad.py)."""
    import inspect

    import torch
    from transformer_engine.pytorch.cpp_extensions import gemm
    from transformer_engine.pytorch.module import linear

    from bridge_recipes.features import te_wgrad

    calls = []
    monkeypatch.setattr(gemm, "general_gemm", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr("transformer_engine.pytorch.cpp_extensions.general_gemm", gemm.general_gemm)
    x, dy, main_grad = torch.ones(4, 3), torch.ones(4, 2), torch.zeros(2, 3)
    te_wgrad.wgrad_gemm_accum_fp32(x, dy, main_grad)
    ((args, kwargs),) = calls
    assert args[0] is x and args[1] is dy and kwargs["out"] is main_grad
    assert (
        kwargs["layout"] == "NT" and kwargs["accumulate"] and kwargs["grad"] and kwargs["out_dtype"] == torch.float32
    )
    source = inspect.getsource(linear)
    assert re.search(r'"layout":\s*"NT"', source)
    assert re.search(r'"out":\s*main_grad\s+if\s+bwd_args\.fuse_wgrad_accumulation\s+else\s+None\b', source)


def test_flash_attention_falls_back_without_flash_attn_before_the_summary(smoke, monkeypatch):
    from megatron.core.transformer.enums import AttnBackend

    from bridge_recipes.recipes.resilience import launched_by_ft_launcher

    assert smoke.model.attention_backend == AttnBackend.flash
    monkeypatch.setattr(launch, "flash_attn_available", lambda: False)
    monkeypatch.setattr(te_wgrad_patch.installed, "apex_grad_fusion_available", lambda: True)
    changes = launch.prepare(smoke)
    assert any(c.startswith("attention_backend: flash -> auto") for c in changes)
    assert smoke.model.attention_backend == AttnBackend.auto
    ft = smoke.ft is not None and not launched_by_ft_launcher()
    assert any(c.startswith("fault tolerance: off") for c in changes) == ft
    assert launch.prepare(smoke) == []  # made once: run() changes nothing after the summary


def test_forward_step_by_model_kind(smoke):
    from bridge_recipes.recipes.base import vlm_pretrain_config

    assert launch.forward_step_for(smoke).__module__ == "bridge_recipes.training.train_step"
    vl = vlm_pretrain_config("qwen35_vl_35b_a3b")
    assert launch.forward_step_for(vl).__module__ == "megatron.bridge.training.vlm_step"


def test_entry_point_by_task(smoke):
    # (megatron.bridge.training.pretrain itself needs nvidia-resiliency-ext, a GPU-only extra)
    assert launch.entry_point_name(smoke, "pretrain") == "pretrain"
    assert launch.entry_point_name(smoke, "sft") == "pretrain"  # no weights: random init
    smoke.checkpoint.pretrained_checkpoint = "/ckpt"
    assert launch.entry_point_name(smoke, "sft") == "finetune"
    smoke.features.random_lora.enabled = True  # a LoRA benchmark on random weights
    assert launch.entry_point_name(smoke, "peft") == "pretrain"


def test_the_initial_weights_do_not_depend_on_the_warmup_shapes(monkeypatch):
    """Megatron-Bridge's JIT warm-up draws random tensors sized by the sequence and micro batch between
    the seeding and the model build; the runner restores the CUDA random state after it."""
    import torch
    from megatron.bridge.training import initialize

    state = {"offset": 0}  # a stand-in CUDA generator: its state is how much was drawn
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: state["offset"])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s: state.update(offset=s))

    def warmup(model_config, micro_batch_size):
        state["offset"] += model_config.seq_length * micro_batch_size  # torch.rand of that many tokens

    monkeypatch.setattr(initialize, "_warmup_jit_function", warmup)
    cfg = SimpleNamespace(seq_length=4096)
    initialize._warmup_jit_function(cfg, 2)
    assert state["offset"] == 8192  # unpatched, the warm-up moves the generator
    warmup_rng.install()
    warmup_rng.install()  # once
    state["offset"] = 7
    initialize._warmup_jit_function(cfg, 2)
    assert state["offset"] == 7
    assert initialize._warmup_jit_function.keeps_rng
