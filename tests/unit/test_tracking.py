"""Log folders follow the save folder; W&B logging is set by flag or override and needs the
wandb package (checked before launch, the package itself never needed by these tests)."""

import importlib.util
import os

import pytest

import bridge_recipes
from bridge_recipes.config import files as config_files
from bridge_recipes.config import tracking
from bridge_recipes.runner.cli import main

SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
SMOKE = "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config"  # saves nothing, logs to experiments/<run>/tb
REAL_FIND_SPEC = importlib.util.find_spec


@pytest.fixture(params=[True, False], ids=["wandb-installed", "wandb-missing"])
def wandb_installed(request, monkeypatch):
    """Pretend the wandb package is (or is not) installed, whatever this machine has."""

    def find_spec(name, *args, **kwargs):
        if name == "wandb":
            return object() if request.param else None
        return REAL_FIND_SPEC(name, *args, **kwargs)

    monkeypatch.setattr(tracking.importlib.util, "find_spec", find_spec)
    return request.param


def test_recipe_logs_beside_its_checkpoints():
    cfg = bridge_recipes.build(SFT)
    run = os.path.dirname(cfg.checkpoint.save)
    assert cfg.logger.tensorboard_dir == os.path.join(run, "tb")
    assert cfg.logger.wandb_project is None and cfg.logger.wandb_save_dir is None


@pytest.mark.parametrize("how", ["flag", "override"])
def test_tensorboard_follows_a_moved_save_folder(how):
    move = {"flags": {"save_dir": "/ckpt/run1"}} if how == "flag" else {"overrides": ["checkpoint.save=/ckpt/run1"]}
    cfg = bridge_recipes.build(SFT, **move)
    assert cfg.checkpoint.save == "/ckpt/run1" and cfg.logger.tensorboard_dir == "/ckpt/run1/tensorboard"
    cfg = bridge_recipes.build(SMOKE, **move)
    assert cfg.logger.tensorboard_dir == "/ckpt/run1/tensorboard"


def test_an_explicit_tensorboard_folder_wins_and_an_unrelated_one_stays():
    cfg = bridge_recipes.build(SFT, flags={"save_dir": "/ckpt/run1"}, overrides=["logger.tensorboard_dir=/tb/a"])
    assert cfg.logger.tensorboard_dir == "/tb/a"


def test_a_tensorboard_folder_set_elsewhere_stays_when_the_save_folder_moves(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(config_files.to_text(bridge_recipes.build(SFT, overrides=["logger.tensorboard_dir=/tb/a"]), SFT))
    cfg = bridge_recipes.build(SFT, config_file=str(path), flags={"save_dir": "/ckpt/run2"})
    assert cfg.checkpoint.save == "/ckpt/run2" and cfg.logger.tensorboard_dir == "/tb/a"


def test_a_saved_config_keeps_following_the_save_folder(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(config_files.to_text(bridge_recipes.build(SFT, flags={"save_dir": "/ckpt/run1"}), SFT))
    cfg = bridge_recipes.build(SFT, config_file=str(path), flags={"save_dir": "/ckpt/run2"})
    assert cfg.logger.tensorboard_dir == "/ckpt/run2/tensorboard"
    assert bridge_recipes.build(SFT, config_file=str(path)).logger.tensorboard_dir == "/ckpt/run1/tensorboard"


def test_wandb_fields_from_the_flags(wandb_installed):
    request = {"flags": {"wandb_project": "qwen", "save_dir": "/ckpt/run1"}}
    if not wandb_installed:
        with pytest.raises(ValueError, match=r"wandb package is not installed.*pip install -e '\.\[wandb\]'"):
            bridge_recipes.build(SFT, **request)
        return
    log = bridge_recipes.build(SFT, **request).logger
    assert (log.wandb_project, log.wandb_exp_name, log.wandb_save_dir) == ("qwen", SFT, "/ckpt/run1/wandb")
    log = bridge_recipes.build(SFT, flags={"wandb_project": "qwen", "wandb_exp_name": "try 2"}).logger
    assert log.wandb_exp_name == "try 2"
    assert log.wandb_save_dir == os.path.join(bridge_recipes.build(SFT).checkpoint.save, "wandb")
    log = bridge_recipes.build(SFT, overrides=["logger.wandb_project=qwen", "logger.wandb_save_dir=/w"]).logger
    assert log.wandb_save_dir == "/w" and log.wandb_exp_name == SFT


@pytest.mark.parametrize("ask", [["--wandb-project", "qwen"], ["logger.wandb_project=qwen"]])
def test_dry_run_refuses_wandb_without_the_package(capsys, wandb_installed, ask):
    code = main(["--recipe", SFT, "--dry-run", "--world-size", "8", *ask])
    err = capsys.readouterr().err
    if wandb_installed:
        assert code == 0, err
    else:
        assert code == 2 and "logger.wandb_project='qwen'" in err and "not installed" in err


def test_without_a_project_wandb_is_never_asked_for(wandb_installed):
    assert tracking.problem(bridge_recipes.build(SFT)) is None


def _bridge_state(cfg):
    """Megatron-Bridge's own training state for ``cfg``: what train() logs through (rank 0 of 1)."""
    from megatron.bridge.training.state import GlobalState

    state = GlobalState()
    state.cfg = cfg
    return state


def test_megatron_bridge_writes_tensorboard_events_into_the_save_folder(tmp_path):
    """Not just the field: Megatron-Bridge's TensorBoard writer, built from the recipe's config with a
    moved save folder, writes its events under DIR/tensorboard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save = tmp_path / "run1"
    cfg = bridge_recipes.build(SFT, flags={"save_dir": str(save)})
    writer = _bridge_state(cfg).tensorboard_logger
    writer.add_scalar("lm loss", 2.5, 1)
    writer.close()
    events = EventAccumulator(str(save / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("lm loss")] == [(1, 2.5)]


def test_megatron_bridge_starts_wandb_offline_in_the_save_folder(tmp_path, monkeypatch):
    """With the extra installed, ``--wandb-project`` starts Megatron-Bridge's W&B run (offline here:
    no network) named after the recipe, its files under DIR/wandb."""
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install -e '.[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    save = tmp_path / "run1"
    cfg = bridge_recipes.build(SFT, flags={"save_dir": str(save), "wandb_project": "qwen"})
    logger = _bridge_state(cfg).wandb_logger
    try:
        assert logger is wandb and wandb.run.name == SFT and wandb.run.project == "qwen"
        wandb.log({"lm loss": 2.5}, step=1)
    finally:
        wandb.finish()
    runs = list((save / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
