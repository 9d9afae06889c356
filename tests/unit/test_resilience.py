"""Resilience defaults (real-data recipes on, benchmarks off) and the checkpoint checks."""

import re

import pytest
import yaml

from bridge_recipes.recipes import registry
from bridge_recipes.runner import checks, launch
from bridge_recipes.training import saved_runs

SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"


def build(name=SFT):
    return registry.load(name)()


@pytest.mark.parametrize(
    "name", [n for n, e in registry.discover().items() if e.tree == "bridge_recipes" and "smoke" not in n]
)
def test_real_data_recipes_enable_resilience(name):
    cfg = build(name)
    c = cfg.checkpoint
    assert c.ckpt_format == "torch_dist" and c.async_save and c.use_persistent_ckpt_worker
    assert c.load == c.save and c.save and c.save_interval > 0  # automatic resume from the save folder
    assert cfg.ft.enable_ft_package and cfg.ft.calc_ft_timeouts
    assert cfg.nvrx_straggler.enabled and not cfg.nvrx_straggler.stop_if_detected
    assert cfg.inprocess_restart is not None and cfg.inprocess_restart.enabled is False


@pytest.mark.parametrize("name", [n for n, e in registry.discover().items() if e.tree == "perf_recipes"])
def test_benchmarks_keep_resilience_off(name):
    cfg = build(name)
    assert cfg.ft is None and cfg.nvrx_straggler is None and cfg.inprocess_restart is None
    assert not cfg.checkpoint.async_save


def test_in_process_restart_can_be_switched_on_by_override():
    from bridge_recipes.config.overrides import apply_all

    cfg = build()
    apply_all(cfg, {}, ["inprocess_restart.enabled=true", "nvrx_straggler.stop_if_detected=true"])
    assert cfg.inprocess_restart.enabled and cfg.nvrx_straggler.stop_if_detected


def errors(cfg, world=8):
    return [str(p) for p in checks.errors(checks.check(cfg, world))]


def test_save_interval_zero(tmp_path):
    cfg = build()
    cfg.checkpoint.save_interval = 0
    assert any("checkpoint.save_interval=0" in e for e in errors(cfg))


def test_async_save_without_a_folder():
    cfg = build()
    cfg.checkpoint.save = cfg.checkpoint.load = None
    assert any("checkpoint.async_save needs checkpoint.save" in e for e in errors(cfg))


def test_missing_resume_and_pretrained_paths(tmp_path):
    cfg = build()
    cfg.checkpoint.save = str(tmp_path / "new")
    cfg.checkpoint.load = str(tmp_path / "elsewhere")
    cfg.checkpoint.pretrained_checkpoint = str(tmp_path / "weights")
    msgs = errors(cfg)
    assert any("checkpoint.load=" in e and "does not exist" in e for e in msgs)
    assert any("checkpoint.pretrained_checkpoint=" in e for e in msgs)


def test_fresh_start_when_the_save_folder_is_empty(tmp_path):
    cfg = build()
    cfg.checkpoint.save = cfg.checkpoint.load = str(tmp_path / "run")
    assert errors(cfg) == []


def fake_checkpoint(folder, iteration=40, model=None, checkpoint=None, world_size=8, distributed=True, peft=None):
    it = folder / f"iter_{iteration:07d}"
    it.mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    base = {
        "num_layers": 40,
        "hidden_size": 2048,
        "num_moe_experts": 256,
        "vocab_size": 248320,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
    }
    doc = {
        "model": {**base, **(model or {})},
        "checkpoint": {"ckpt_format": "torch_dist", **(checkpoint or {})},
        "optimizer": {"use_distributed_optimizer": distributed},
    }
    if world_size:
        doc["dist"] = {"world_size": world_size}
    doc["peft"] = peft
    (it / "run_config.yaml").write_text(yaml.safe_dump(doc))
    return folder


def resumed(tmp_path, name=SFT, **kw):
    cfg = build(name)
    cfg.checkpoint.save = cfg.checkpoint.load = str(fake_checkpoint(tmp_path / "run", **kw))
    return cfg


def test_resume_with_the_saved_layout_is_fine(tmp_path):
    assert errors(resumed(tmp_path)) == []


LORA = {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": 32}


def test_a_lora_run_never_resumes_a_full_fine_tuning_checkpoint(tmp_path):
    (msg,) = errors(resumed(tmp_path, "qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config"))
    assert re.search(r"saved by\b.*\bfull fine-tuning\b.*\bthis is\b.*\bLoRA run\b", msg), msg
    assert f"checkpoint.pretrained_checkpoint={tmp_path / 'run'}" in msg


def test_a_full_fine_tuning_run_never_resumes_a_lora_checkpoint(tmp_path):
    (msg,) = errors(resumed(tmp_path, peft=LORA))
    assert re.search(r"saved by\b.*\bLoRA run\b.*\bthis is\b.*\bfull fine-tuning\b", msg), msg
    assert "checkpoint.save=DIR" in msg and "pretrained" not in msg


def test_a_lora_run_resumes_its_own_kind(tmp_path):
    assert errors(resumed(tmp_path, "qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config", peft=LORA)) == []


def test_each_recipe_saves_and_resumes_in_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = [n for n, e in registry.discover().items() if e.tree == "bridge_recipes" and e.alias_of is None]
    folders = {}
    for name in names:
        c = build(name).checkpoint
        if c.save:
            assert c.load == c.save, name
            folders.setdefault(c.save, []).append(name)
    assert folders and all(len(v) == 1 for v in folders.values()), {k: v for k, v in folders.items() if len(v) > 1}
    assert str(tmp_path / "experiments" / SFT.removesuffix("_config") / "checkpoints") in folders


def test_a_folder_the_recipe_sets_is_kept(tmp_path):
    from bridge_recipes.recipes.recipe import own_run_folder

    cfg = build()
    cfg.checkpoint.save = cfg.checkpoint.load = str(tmp_path / "mine")
    own_run_folder(cfg, "other")
    assert cfg.checkpoint.save == str(tmp_path / "mine")


def test_resume_with_another_architecture_is_refused(tmp_path):
    msgs = errors(resumed(tmp_path, model={"num_layers": 48}))
    assert any("saved with model.num_layers=48" in e and "another architecture" in e for e in msgs)


def test_legacy_torch_format_cannot_change_tp(tmp_path):
    msgs = errors(resumed(tmp_path, model={"pipeline_model_parallel_size": 2}, checkpoint={"ckpt_format": "torch"}))
    assert any("legacy 'torch' format" in e for e in msgs)


def test_torch_dist_reshards_tp_pp_of_the_weights(tmp_path):
    cfg = resumed(tmp_path, model={"pipeline_model_parallel_size": 2}, world_size=16)
    cfg.checkpoint.load_optim = False  # the weights alone reshard to any layout
    assert errors(cfg) == []


def test_distributed_optimizer_state_reshards_the_data_parallel_size(tmp_path):
    """Saved at 16 GPUs (DP16), resumed at 8 (DP8): the dp_reshardable format allows it."""
    assert errors(resumed(tmp_path, world_size=16)) == []


@pytest.mark.parametrize(
    "field,saved",
    [
        ("expert_model_parallel_size", 4),
        ("pipeline_model_parallel_size", 2),
        ("tensor_model_parallel_size", 2),
        ("context_parallel_size", 2),
        ("expert_tensor_parallel_size", 2),
    ],
)
def test_distributed_optimizer_state_keeps_the_model_parallel_sizes(tmp_path, field, saved):
    now = getattr(build().model, field)
    msgs = errors(resumed(tmp_path / "a", model={field: saved}))
    assert any(f"{field}={saved} -> {now}" in e and "dp_reshardable" in e for e in msgs), msgs
    cfg = resumed(tmp_path / "b", model={field: saved})
    cfg.checkpoint.load_optim = False
    assert errors(cfg) == []
    fully = resumed(tmp_path / "c", model={field: saved}, checkpoint={"dist_ckpt_optim_fully_reshardable": True})
    assert errors(fully) == []


def test_fault_tolerance_off_without_ft_launcher(monkeypatch):
    cfg = build()
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)
    change = launch.fault_tolerance_change(cfg)
    assert change and change.startswith("fault tolerance: off") and not cfg.ft.enable_ft_package
    cfg = build()
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", "/tmp/rmon.sock")
    assert launch.fault_tolerance_change(cfg) is None and cfg.ft.enable_ft_package


def test_latest_run_config_reads_the_tracker(tmp_path):
    folder = fake_checkpoint(tmp_path / "r", iteration=7)
    it, doc = saved_runs.latest_run_config(str(folder))
    assert it == 7 and doc["model"]["num_layers"] == 40
    assert saved_runs.latest_run_config(str(tmp_path)) is None


def test_fields_derived_at_finalize_are_compared_only_when_set(tmp_path):
    """run_config.yaml holds the finalized config (ffn_hidden_size filled in); a recipe that leaves
    it unset derives the same value, so only an explicit different value is refused."""
    cfg = resumed(tmp_path, model={"ffn_hidden_size": 8192})
    cfg.model.ffn_hidden_size = None
    assert errors(cfg) == []
    cfg.model.ffn_hidden_size = 4096
    assert any("saved with model.ffn_hidden_size=8192" in e for e in errors(cfg))
