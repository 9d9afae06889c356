"""Never resume the wrong run: each listed name saves to its own folder; a save folder holding a
checkpoint of another recipe, model, data, sequence length or LoRA setting is refused naming the
difference; --fresh starts a new run in a new subfolder and keeps the old one; the summary says
whether the run resumes and from which step. Checkpoint folders are faked in Megatron's layout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from bridge_recipes.recipes import registry
from bridge_recipes.runner import checks
from bridge_recipes.runner.checkpoints import resume_line, start_fresh
from bridge_recipes.runner.cli import main
from bridge_recipes.training import saved_runs

SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
LORA = "qwen35_35b_a3b_peft_1gpu_h200_bf16_config"
ROWS = Path(__file__).resolve().parents[1] / "fixtures" / "eos_joined_rows"


def fake_checkpoint(folder: Path, iteration: int = 100, run_config: dict | None = None) -> Path:
    """What Megatron writes: the tracker file and an iteration folder with the run's config."""
    it = saved_runs.iteration_folder(folder, iteration)
    it.mkdir(parents=True)
    (folder / saved_runs.TRACKER).write_text(str(iteration))
    (it / saved_runs.RUN_CONFIG).write_text(yaml.safe_dump(run_config or {"model": {}, "checkpoint": {}}))
    return folder


def build(name: str = SFT, rows: bool = True):
    import bridge_recipes

    if rows:
        return bridge_recipes.build(name, dataset="sft-rows", overrides=[f"dataset.path={ROWS}"])
    return bridge_recipes.build(name)


def errors(cfg, recipe: str = SFT, world: int = 8) -> list[str]:
    return [p.message for p in checks.errors(checks.check(cfg, world, recipe))]


def saved_by(tmp_path: Path, cfg, recipe: str = SFT, run_config: dict | None = None, **change) -> Path:
    """A save folder holding a checkpoint of ``cfg``'s run (its identity as the launch writes it),
    changed by ``change`` (``section__field=value`` or ``section=value``)."""
    folder = fake_checkpoint(tmp_path / "run", run_config=run_config)
    identity = saved_runs.run_identity(cfg, recipe)
    for key, value in change.items():
        section, _, field = key.partition("__")
        if field:
            identity[section][field] = value
        else:
            identity[section] = value
    saved_runs.write_identity(folder, identity)
    return folder


def resuming(cfg, folder: Path):
    cfg.checkpoint.save = cfg.checkpoint.load = str(folder)
    return cfg


def test_each_listed_name_saves_to_its_own_folder(tmp_path, monkeypatch):
    """A Qwen3.6 alias and its Qwen3.5 twin build one config, but save, resume and log in folders of their own."""
    monkeypatch.chdir(tmp_path)
    aliases = registry.aliases()
    assert aliases
    folders: dict[str, list[str]] = {}
    for name in [*aliases, *{e.alias_of for e in aliases.values()}]:
        cfg = registry.load(name)()
        c, own = cfg.checkpoint, str(tmp_path / "experiments" / name.removesuffix("_config"))
        if c.save:
            assert c.load == c.save == f"{own}/checkpoints", (name, c.save)
            folders.setdefault(c.save, []).append(name)
        assert cfg.logger.tensorboard_dir in (None, f"{own}/tb"), name
    assert {f: n for f, n in folders.items() if len(n) > 1} == {}


def test_a_checkpoint_of_this_run_resumes_and_the_summary_says_from_which_step(tmp_path):
    cfg = build()
    resuming(cfg, saved_by(tmp_path, cfg))
    assert errors(cfg) == []
    line = resume_line(cfg)
    assert line.startswith(f"yes, from step 100 of {tmp_path / 'run'}"), line


@pytest.mark.parametrize(
    "change, named",
    [
        (
            {"recipe": "qwen36_35b_a3b_sft_8gpu_h200_bf16_config"},
            r"recipe: qwen36_35b_a3b_sft_8gpu_h200_bf16_config -> ",
        ),
        ({"model__hf_model_id": "Qwen/Qwen3.6-35B-A3B"}, r"model\.hf_model_id: Qwen/Qwen3\.6-35B-A3B -> None"),
        ({"model__num_layers": 4}, r"model\.num_layers: 4 -> 40"),
        (
            {"data__rows_sha256": "0" * 64, "data__rows": 137},
            r"data: rows .*\(137 rows, sha256 000000000000\) -> rows",
        ),
        ({"seq_length": 4096}, r"sequence length: 4096 -> 8192"),
        ({"lora": {"scheme": "LoRA", "dim": 16, "alpha": 32}}, r"LoRA: LoRA rank 16 alpha 32 .* -> full fine-tuning"),
    ],
    ids=["recipe", "model", "shape", "rows", "seq_length", "lora"],
)
def test_a_checkpoint_of_another_run_is_refused_naming_the_difference(tmp_path, change, named):
    cfg = build()
    resuming(cfg, saved_by(tmp_path, cfg, **change))
    (msg,) = errors(cfg)
    assert re.search(named, msg), msg
    assert "step 100" in msg and "--fresh" in msg and str(tmp_path / "run" / "fresh_1") in msg


def test_other_rows_of_the_same_path_are_another_run(tmp_path):
    """The rows are compared by their content hash, not their folder: rebuilt rows are other data."""
    cfg = build()
    folder = saved_by(tmp_path, cfg, data__rows_sha256="f" * 64)
    assert saved_runs.read_identity(folder)["data"]["path"] == str(ROWS)
    (msg,) = errors(resuming(cfg, folder))
    assert "data: rows" in msg


def test_a_lora_rank_change_is_refused(tmp_path):
    cfg = build(LORA)
    cfg.checkpoint.pretrained_checkpoint = None
    other = saved_runs.lora_settings(cfg.peft) | {"dim": 8}
    lora_config = {"model": {}, "checkpoint": {}, "peft": {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": 8}}
    resuming(cfg, saved_by(tmp_path, cfg, LORA, run_config=lora_config, lora=other))
    msgs = errors(cfg, LORA, world=1)
    assert any(re.search(r"LoRA: LoRA rank 8 .* -> LoRA rank 32", m) for m in msgs), msgs


def test_a_checkpoint_saved_without_an_identity_is_compared_on_its_run_config(tmp_path):
    cfg = build()
    folder = fake_checkpoint(tmp_path / "run", 40, {"model": {"seq_length": 4096}, "checkpoint": {}})
    (msg,) = errors(resuming(cfg, folder))
    assert "sequence length: 4096 -> 8192" in msg and "recipe and data not compared" in msg
    same = fake_checkpoint(tmp_path / "same", 40, {"model": {"seq_length": 8192}, "checkpoint": {}})
    assert errors(resuming(cfg, same)) == []
    assert "without run_identity.json" in resume_line(cfg)


def test_saving_beside_another_runs_checkpoint_is_refused(tmp_path):
    cfg = build()
    cfg.checkpoint.save = str(saved_by(tmp_path, cfg, seq_length=4096))
    cfg.checkpoint.load = None
    (msg,) = errors(cfg)
    assert msg.startswith(f"checkpoint.save={tmp_path / 'run'}") and "--save-dir DIR" in msg


def test_an_unreadable_identity_is_refused_naming_the_file(tmp_path):
    cfg = build()
    folder = fake_checkpoint(tmp_path / "run")
    (folder / saved_runs.IDENTITY).write_text("{not json")
    (msg,) = errors(resuming(cfg, folder))
    assert saved_runs.IDENTITY in msg and "--save-dir" in msg


def test_the_identity_round_trips_and_matches_its_own_run(tmp_path):
    cfg = build()
    written = saved_runs.write_identity(tmp_path / "new" / "run", saved_runs.run_identity(cfg, SFT))
    read = saved_runs.read_identity(written.parent)
    assert read["recipe"] == SFT and read["seq_length"] == cfg.model.seq_length and read["lora"] is None
    assert read["data"]["rows_sha256"] == json.loads((ROWS / "manifest.json").read_text())["rows_sha256"]
    assert saved_runs.identity_differences(read, saved_runs.run_identity(cfg, SFT)) == []


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fresh_starts_a_new_run_in_a_new_subfolder_and_keeps_the_old_one(tmp_path):
    cfg = build()
    folder = saved_by(tmp_path, cfg, seq_length=4096)
    before = _snapshot(folder)
    resuming(cfg, folder)
    tb = cfg.logger.tensorboard_dir
    note = start_fresh(cfg, SFT)
    assert cfg.checkpoint.save == cfg.checkpoint.load == str(folder / "fresh_1")
    assert cfg.logger.tensorboard_dir in (tb, str(folder / "fresh_1" / "tensorboard"))
    assert "step 100" in note and f"--save-dir {folder / 'fresh_1'}" in note
    assert errors(cfg) == [] and _snapshot(folder) == before
    fake_checkpoint(folder / "fresh_1", 5)  # that run saved: the next --fresh takes the next subfolder
    resuming(cfg, folder)
    start_fresh(cfg, SFT)
    assert cfg.checkpoint.save == str(folder / "fresh_2")
    assert [p.name for p in saved_runs.fresh_runs(folder)] == ["fresh_1"]


def test_fresh_over_an_empty_folder_stays_there_and_refuses_an_explicit_resume(tmp_path):
    cfg = build()
    resuming(cfg, tmp_path / "empty")
    assert "holds no checkpoint" in start_fresh(cfg, SFT) and cfg.checkpoint.save == str(tmp_path / "empty")
    cfg.checkpoint.load = str(tmp_path / "other")
    with pytest.raises(ValueError, match=r"--fresh starts a new run.*checkpoint\.load="):
        start_fresh(cfg, SFT)


def test_the_dry_run_refuses_another_run_and_fresh_gets_past_it(tmp_path, capsys):
    cfg = build()
    folder = saved_by(tmp_path, cfg, seq_length=4096, recipe="qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config")
    argv = ["--recipe", SFT, "--dry-run", "--world-size", "8", "--dataset", "sft-rows", f"dataset.path={ROWS}"]
    argv += ["--save-dir", str(folder)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "sequence length: 4096 -> 8192" in err and "recipe: qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config" in err
    assert "--fresh" in err and "Traceback" not in err
    assert main([*argv, "--fresh"]) == 0
    out = capsys.readouterr().out
    resume = next(line for line in out.splitlines() if line.startswith("resume "))
    assert f"a new run in {folder / 'fresh_1'}" in resume and "step 100" in resume
    assert re.search(rf"^save\s+{re.escape(str(folder / 'fresh_1'))} ", out, re.M)
    assert not (folder / "fresh_1").exists()  # a dry run writes nothing
