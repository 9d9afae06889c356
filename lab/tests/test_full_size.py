"""lab/full_size.py: the queue of every one-GPU recipe at full size and the table of its runs; and
lab/gpu/watch.sh, which ends a run that outlives its limit."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from lab import full_size

ROOT = Path(__file__).resolve().parents[2]
QUEUE = ROOT / "lab/gpu/queues/one_gpu_full_size.txt"


def _steps(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return full_size.queue_lines()


def test_queue_runs_every_one_gpu_recipe_on_both_shapes(lines):
    runs = [line for line in lines if "scripts/benchmark.py" in line]
    recipes = full_size.one_gpu_recipes()
    assert "qwen35_35b_a3b_peft_1gpu_h100_bf16_config" in recipes
    assert not [r for r in recipes if r.startswith("qwen36_") or "smoke" in r]
    for recipe in recipes:
        for shape, folder in full_size.SHAPES.items():
            mine = [line for line in runs if f"--out $OUT/full_size/{recipe}__{shape}.yaml" in line]
            assert len(mine) == 1, (recipe, shape)
            assert f"/{folder} " in mine[0]
            assert f"--steps {full_size.STEPS} " in mine[0]


def test_queue_caps_smaller_cards_and_keeps_h200_lines_on_an_h200(lines):
    from bridge_recipes.hardware.gpus import class_memory_gb
    from bridge_recipes.recipes import registry

    for line in (line for line in lines if "scripts/benchmark.py" in line):
        recipe = line.split("--recipe ")[1].split()[0]
        gpu = registry.find(recipe).meta.gpu
        if gpu == "h200":
            assert line.startswith("python3 lab/gpu/needs_memory.py 140 && ") and "--gpu-memory-gb" not in line
        else:
            assert f"--gpu-memory-gb {class_memory_gb(gpu):g} " in line


def test_rows_are_built_before_the_runs_that_read_them(lines):
    built: set[str] = set()
    for line in lines:
        if "make_lognormal_rows.py" in line:
            for part in line.split("&&"):
                words = part.split()
                folder = words[2]
                built.add(f"{folder}/long_split" if "--long-split" in words else f"{folder}/boundaries")
        else:
            assert line.split("--rows ")[1].split()[0] in built, line


def test_committed_queue_is_the_generated_one(lines):
    assert _steps(QUEUE.read_text()) == lines, "regenerate with: python -m lab.full_size queue"


def _log(steps: int, mode_words: str) -> str:
    head = f"packed rows: attention runs {mode_words} (bridge_recipes.packed_attention)\n"
    body = "".join(
        f" [2026-12-07 10:00:{i:02d}] iteration {i}/ {steps} | consumed samples: {2 * i} | "
        f"elapsed time per iteration (ms): {180000.0 if i == 1 else 7500.0} | learning rate: 1.0E-04 | "
        f"global batch size: 2 | lm loss: {12.0 - 0.1 * i:.4E} | grad norm: 1.000 |\n"
        for i in range(1, steps + 1)
    )
    return head + body


def _result(path: Path, recipe: str) -> None:
    from bridge_recipes.bench.result import CAP_NOTE, SCHEMA_VERSION, TOP_LEVEL_KEYS

    doc = dict.fromkeys(TOP_LEVEL_KEYS)
    doc.update(
        schema_version=SCHEMA_VERSION,
        recipe=recipe,
        stack={"gpu_name": "NVIDIA H100 80GB HBM3"},
        result={
            "useful_tokens_per_s_per_gpu": 2100.5,
            "peak_allocated_gb": 79.4,
            "steps_per_run": 20,
            "measured": "2026-12-07",
        },
        notes=[f"{CAP_NOTE} 85.0081 GB"],
    )
    import yaml

    path.write_text(yaml.safe_dump(doc))


def test_assemble_reads_results_logs_and_runs_that_gave_none(tmp_path):
    recipe = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"
    _result(tmp_path / f"{recipe}__short.yaml", recipe)
    (tmp_path / f"{recipe}__short.log").write_text(_log(20, "one conversation at a time"))
    (tmp_path / f"{recipe}__long_split.log").write_text(_log(1, "one variable-length flash-attention call"))
    (tmp_path / "unrelated.log").write_text("x")
    plans = []

    def plan(name, cap):
        plans.append((name, cap))
        return 76.0

    entries = full_size.assemble([tmp_path], plan=plan)
    assert [(e["recipe"], e["rows"]) for e in entries] == [(recipe, "long_split"), (recipe, "short")]
    stalled, done = entries
    assert set(full_size.FIELDS) <= set(done)
    assert done["useful_tokens_per_s"] == 2100.5 and done["peak_gb"] == 79.4 and done["planner_gb"] == 76.0
    assert done["memory_cap_gb"] == pytest.approx(85.0081) and plans == [(recipe, pytest.approx(85.0081))]
    assert done["first_step_s"] == 180.0 and done["loss_first"] == pytest.approx(11.9)
    assert done["loss_last"] == pytest.approx(10.0) and done["steps"] == 20
    assert done["packed_attention"] == "per_conversation" and done["gpu"] == "h100"
    assert done["hardware"] == "NVIDIA H100 80GB HBM3" and done["date"] == "2026-12-07"
    assert done["peak_vs_planner"] == pytest.approx(79.4 / 76.0 - 1, abs=1e-4)
    assert stalled["packed_attention"] == "flash_varlen" and stalled["steps"] == 1
    assert "no result file" in stalled["error"] and stalled["useful_tokens_per_s"] is None


def test_assemble_command_refuses_an_empty_folder(tmp_path, capsys):
    assert full_size.main(["assemble", str(tmp_path), "--out", str(tmp_path / "t.json")]) == 2
    assert full_size.main(["assemble", str(tmp_path / "missing"), "--out", str(tmp_path / "t.json")]) == 2
    assert not (tmp_path / "t.json").exists()


def test_assemble_command_writes_the_table(tmp_path):
    recipe = "qwen35_27b_peft_1gpu_l40s_fp8base_config"
    (tmp_path / f"{recipe}__short.log").write_text(_log(3, "one conversation at a time"))
    out = tmp_path / "table.json"
    assert full_size.main(["assemble", str(tmp_path), "--out", str(out)]) == 0
    (only,) = json.loads(out.read_text())
    assert only["recipe"] == recipe and only["steps"] == 3 and only["gpu"] == "l40s"


def test_watch_ends_a_command_past_its_limit(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "NAME": "slow", "LIMIT": "1", "STACK_EVERY": "100"}
    done = subprocess.run(
        ["bash", str(ROOT / "lab/gpu/watch.sh"), "sleep", "60"], env=env, capture_output=True, text=True, timeout=40
    )
    assert done.returncode == 124, done.stdout + done.stderr
    assert "ended after 1s" in (tmp_path / "slow.out").read_text()


def test_watch_passes_a_finished_command_through(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "NAME": "quick", "LIMIT": "60"}
    done = subprocess.run(
        ["bash", str(ROOT / "lab/gpu/watch.sh"), "bash", "-c", "echo hi; exit 3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert done.returncode == 3 and (tmp_path / "quick.out").read_text() == "hi\n"


def test_the_mode_is_read_from_the_install_line_as_it_is_written_now_and_was_before():
    new = "[run_recipe] packed rows: attention runs one variable-length flash-attention call "
    assert full_size.packed_attention_of(new + "(features.packed_attention.mode=flash_varlen)\n") == "flash_varlen"
    old = "packed rows: attention runs one conversation at a time (bridge_recipes.packed_attention)\n"
    assert full_size.packed_attention_of(old) == "per_conversation"
    assert full_size.packed_attention_of("no such line") is None


def test_committed_table_is_what_its_evidence_says():
    """lab/results/one_gpu_recipes_full_size.json re-assembled from the result files and logs under
    lab/evidence/full_size/ (the planner figure as committed: it is the planner's at the time)."""
    table = ROOT / "lab/results/one_gpu_recipes_full_size.json"
    committed = json.loads(table.read_text())
    planned = {(e["recipe"], e["memory_cap_gb"]): e["planner_gb"] for e in committed}
    again = full_size.assemble([ROOT / "lab/evidence/full_size"], plan=lambda r, cap: planned[(r, cap)])
    assert again == committed
    for line in committed:
        assert (ROOT / line["result"]).is_file() and line["steps"] == full_size.STEPS
