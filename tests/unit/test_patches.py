"""The run-time patches of upstream code (bridge_recipes.patches, and the features' in
bridge_recipes.features) against the installed upstream: every symbol a patch touches is there with the
parameters it was written for, every patch's version range holds the installed versions, the runner
refuses a run whose patches meet other versions, and apply() installs what a config asks for, once."""

from __future__ import annotations

import importlib.metadata

import pytest

import bridge_recipes
from bridge_recipes import features, patches
from bridge_recipes.patches import contract

EVERY = (*features.PATCHES, *patches.ALL)

SMOKE = "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config"
LORA = "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config"
FP8_BASE = "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config"


@pytest.mark.parametrize("patch", EVERY, ids=lambda p: p.name)
def test_every_target_resolves_with_the_parameters_it_was_written_for(patch):
    """Fails when upstream moves or changes a patched symbol."""
    assert patch.targets
    assert contract.target_problems(patch) == []


@pytest.mark.parametrize("patch", EVERY, ids=lambda p: p.name)
def test_every_patch_declares_a_bounded_range_holding_the_installed_version(patch):
    from packaging.specifiers import SpecifierSet

    assert patch.written_for
    for dist, spec in patch.written_for.items():
        operators = {s.operator for s in SpecifierSet(spec)}
        assert ">=" in operators and "<" in operators, f"{patch.name}: {dist} {spec} is not a bounded range"
        assert importlib.metadata.version(dist) in SpecifierSet(spec), f"{patch.name}: {dist}"
    assert contract.version_problems(patch) == []


def test_every_patch_module_is_registered_once():
    from pathlib import Path

    modules = {p.stem for p in Path(patches.__file__).parent.glob("*.py")} - {"__init__", "contract"}
    assert sorted(p.name for p in patches.ALL) == sorted(modules)
    assert patches.by_name("warmup_rng") is patches.warmup_rng.PATCH
    feature_modules = {p.stem for p in Path(features.__file__).parent.glob("*.py")} - {"__init__"}
    assert sorted(p.name for p in features.PATCHES) == sorted(feature_modules)
    assert all(p.source == f"bridge_recipes/features/{p.name}.py" for p in features.PATCHES)
    assert len({p.name for p in EVERY}) == len(EVERY)
    launch = [p.name for p in features.AT_LAUNCH]
    assert set(launch) <= {p.name for p in EVERY} and {p.name for p in features.PATCHES} <= set(launch)


def test_no_feature_has_a_same_named_module_elsewhere_in_the_package():
    from pathlib import Path

    root = Path(bridge_recipes.__file__).parent
    names = {p.stem for p in (root / "features").glob("*.py")} - {"__init__"}
    twins = [str(p.relative_to(root)) for p in root.rglob("*.py") if p.stem in names and p.parent.name != "features"]
    assert twins == []


def test_a_moved_or_changed_symbol_is_named(monkeypatch):
    from megatron.bridge.training import initialize

    patch = patches.warmup_rng.PATCH
    monkeypatch.setattr(initialize, "_warmup_jit_function", lambda model_config: None)
    (changed,) = contract.target_problems(patch)
    assert "_warmup_jit_function takes ('model_config',)" in changed and "megatron-bridge >=0.6,<0.7" in changed
    monkeypatch.delattr(initialize, "_warmup_jit_function")
    (gone,) = contract.target_problems(patch)
    assert "_warmup_jit_function is gone" in gone
    with pytest.raises(contract.PatchError, match="_warmup_jit_function"):
        patches.warmup_rng.install()


def _installed_as(monkeypatch, dist: str, version: str) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version if name == dist else real(name))


def test_a_version_outside_the_range_is_named_with_both_versions(monkeypatch):
    _installed_as(monkeypatch, "transformer-engine", "2.22.0")
    (msg,) = contract.version_problems(features.packed_attention.PATCH)
    assert "patch packed_attention" in msg and "transformer-engine >=2.20,<2.21" in msg and "installed 2.22.0" in msg
    assert "bridge_recipes/features/packed_attention.py" in msg


def test_the_dry_run_refuses_patches_written_for_other_versions(monkeypatch, capsys):
    from bridge_recipes.runner import cli

    _installed_as(monkeypatch, "megatron-bridge", "0.7.0")
    assert cli.main(["--recipe", SMOKE, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "patch warmup_rng" in err and "megatron-bridge >=0.6,<0.7" in err and "installed 0.7.0" in err
    assert "checks: ok" not in err


def test_the_dry_run_checks_only_the_patches_the_run_installs(monkeypatch):
    """The chat-template renderer's patch is not the training run's: another transformers does not
    refuse a run (and the renderer, outside its range, renders unpatched)."""
    cfg = bridge_recipes.build(SMOKE)
    assert features.patch_problems(cfg, dry_run=True) == []
    _installed_as(monkeypatch, "transformers", "6.0.0")
    assert features.patch_problems(cfg, dry_run=True) == []
    assert not patches.jinja_sandbox.memoize("{{ messages }}")


def _names(cfg) -> set[str]:
    return {p.name for p in features.wanted(cfg)}


def test_each_config_asks_for_its_patches():
    cfg = bridge_recipes.build(SMOKE)
    cfg.model.gradient_accumulation_fusion = False
    always = {"dataset_helpers", "warmup_rng"}  # this install ships the compiled dataset helpers
    assert _names(cfg) == always
    cfg.model.gradient_accumulation_fusion = True
    assert _names(cfg) == always | {"te_wgrad"}  # no APEX here
    cfg.dataset.enable_offline_packing = True
    assert "packed_attention" in _names(cfg)
    chunked = bridge_recipes.build(LORA, overrides=["features.chunked_loss.enabled=true"])
    assert "chunked_loss" in _names(chunked) and "chunked_loss" not in _names(bridge_recipes.build(LORA))
    random = bridge_recipes.build(LORA, overrides=["features.random_lora.enabled=true"])
    assert "random_lora" in _names(random) and "random_lora" not in _names(chunked)
    assert "fp8_base" in _names(bridge_recipes.build(FP8_BASE)) and "fp8_base" not in _names(chunked)


def test_apply_installs_exactly_what_the_config_asks_for_once(monkeypatch):
    from megatron.bridge.training import initialize, setup
    from megatron.core.extensions.transformer_engine import TEDotProductAttention

    # undone after the test: apply() patches the (one-run) training process
    for owner, name in (
        (TEDotProductAttention, "forward"),
        (initialize, "_warmup_jit_function"),
        (initialize, "compile_helpers"),
        (setup, "_create_peft_pre_wrap_hook"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setitem(features.packed_attention._state, "original", None)
    original_forward, peft_hook = TEDotProductAttention.forward, setup._create_peft_pre_wrap_hook

    cfg = bridge_recipes.build(SMOKE)
    cfg.model.gradient_accumulation_fusion = False
    cfg.dataset.enable_offline_packing = True
    lines = features.apply(cfg)
    assert len(lines) == 2
    assert any(line.startswith("packed rows:") and features.packed_attention.KEY in line for line in lines)
    assert TEDotProductAttention.forward is not original_forward and features.packed_attention.installed()
    assert initialize._warmup_jit_function.keeps_rng
    installed = (TEDotProductAttention.forward, initialize._warmup_jit_function, initialize.compile_helpers)
    # not asked for: LoRA from random weights, the chunked loss, the FP8 base
    assert setup._create_peft_pre_wrap_hook is peft_hook
    assert not getattr(cfg.model, "_pre_wrap_hooks", None)

    assert features.apply(cfg) == lines  # idempotent: the same patches, nothing wrapped twice
    assert (TEDotProductAttention.forward, initialize._warmup_jit_function, initialize.compile_helpers) == installed
    assert initialize._warmup_jit_function.__wrapped__ is not installed[1]


def test_apply_refuses_before_installing_anything(monkeypatch):
    from megatron.bridge.training import initialize

    monkeypatch.setattr(initialize, "_warmup_jit_function", initialize._warmup_jit_function)
    before = initialize._warmup_jit_function
    cfg = bridge_recipes.build(SMOKE)
    cfg.model.gradient_accumulation_fusion = False
    _installed_as(monkeypatch, "megatron-core", "0.20.0")  # dataset_helpers' range
    with pytest.raises(contract.PatchError, match="installed 0.20.0"):
        features.apply(cfg)
    assert initialize._warmup_jit_function is before
