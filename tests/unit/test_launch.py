"""Hand-off to Megatron-Bridge: registry-install adjustments, forward step, entry point."""

import importlib.util
from types import SimpleNamespace

import pytest

from bridge_recipes.runner import launch


@pytest.fixture
def smoke():
    from bridge_recipes.qwen.h200.qwen35 import qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config

    return qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config()


def test_helper_compile_is_skipped_for_the_wheel(capsys, monkeypatch):
    import megatron.bridge.training.initialize as init

    monkeypatch.setattr(init, "compile_helpers", init.compile_helpers)
    assert launch.dataset_helpers_prebuilt()  # this install: compiled module, no Makefile
    assert launch.skip_helper_compile_if_prebuilt()
    init.compile_helpers()  # now a no-op instead of running make
    assert capsys.readouterr().out.count("[run_recipe] dataset helpers") == 1


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
    assert not launch.dataset_helpers_prebuilt()


def test_grad_fusion_off_without_apex(smoke, capsys, monkeypatch):
    smoke.model.gradient_accumulation_fusion = True
    monkeypatch.setattr(launch, "apex_grad_fusion_available", lambda: False)
    assert launch.disable_grad_fusion_without_apex(smoke)
    assert smoke.model.gradient_accumulation_fusion is False
    assert "gradient_accumulation_fusion: off" in capsys.readouterr().out


def test_grad_fusion_kept_with_apex(smoke, monkeypatch):
    smoke.model.gradient_accumulation_fusion = True
    monkeypatch.setattr(launch, "apex_grad_fusion_available", lambda: True)
    assert not launch.disable_grad_fusion_without_apex(smoke)
    assert smoke.model.gradient_accumulation_fusion is True


def test_flash_attention_falls_back_without_flash_attn(smoke, monkeypatch):
    from megatron.core.transformer.enums import AttnBackend

    assert smoke.model.attention_backend == AttnBackend.flash
    monkeypatch.setattr(launch, "flash_attn_available", lambda: False)
    assert launch.fall_back_from_flash_without_flash_attn(smoke)
    assert smoke.model.attention_backend == AttnBackend.auto


def test_forward_step_by_model_kind(smoke):
    from bridge_recipes.common import vlm_pretrain_config

    assert launch.forward_step_for(smoke).__module__ == "bridge_recipes.train_step"
    vl = vlm_pretrain_config("qwen35_vl_35b_a3b")
    assert launch.forward_step_for(vl).__module__ == "megatron.bridge.training.vlm_step"


def test_entry_point_by_task(smoke):
    # (megatron.bridge.training.pretrain itself needs nvidia-resiliency-ext, a GPU-only extra)
    assert launch.entry_point_name(smoke, "pretrain") == "pretrain"
    assert launch.entry_point_name(smoke, "sft") == "pretrain"  # no weights: random init
    smoke.checkpoint.pretrained_checkpoint = "/ckpt"
    assert launch.entry_point_name(smoke, "sft") == "finetune"
