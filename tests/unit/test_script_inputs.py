"""Scripts check their arguments before doing work, never write over an input, and fail with a
message (exit 2), not a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.bench.benchmark import main as benchmark_main

ROOT = Path(__file__).resolve().parents[2]


def _script(name, *args):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *map(str, args)], cwd=ROOT, capture_output=True, text=True
    )


def _log(losses) -> str:
    """Megatron's iteration lines with these losses, as a training log prints them."""
    n = len(losses)
    return "".join(
        f" [2026-01-01 00:00:{i:02d}] iteration {i:8d}/{n:8d} | consumed samples: {4 * i:12d} | "
        f"elapsed time per iteration (ms): 2338.1 | global batch size:     4 | lm loss: {loss:.6E} |\n"
        for i, loss in enumerate(losses, 1)
    )


def _two_logs(tmp_path):
    """Two training logs whose loss curves agree (the same fall, within a tenth of a percent)."""
    curve = [12.8 - 0.9 * i for i in range(12)]
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text(_log(curve))
    b.write_text(_log([v * 1.001 for v in curve]))
    return a, b


def test_compare_losses_refuses_to_write_over_an_input(tmp_path):
    a, b = _two_logs(tmp_path)
    before = b.read_bytes()
    p = _script("compare_losses.py", a, b, "--out", b)
    assert p.returncode == 2 and f"--out {b}" in p.stderr and "input files" in p.stderr
    assert b.read_bytes() == before


@pytest.mark.parametrize(
    "extra,text",
    [
        (["--out", "{tmp}/missing/out.json"], "does not exist"),
        (["--out", "{tmp}"], "is a folder"),
        (["{tmp}/a.log"], "3 logs given"),
        (["--reference", "x"], "drop them"),
    ],
)
def test_compare_losses_bad_arguments(tmp_path, extra, text):
    a, b = _two_logs(tmp_path)
    p = _script("compare_losses.py", a, b, *[e.format(tmp=tmp_path) for e in extra])
    assert p.returncode == 2 and text in p.stderr and "Traceback" not in p.stderr


def test_compare_losses_binary_log(tmp_path):
    a, _ = _two_logs(tmp_path)
    blob = tmp_path / "blob.log"
    blob.write_bytes(bytes(range(256)) * 4)
    p = _script("compare_losses.py", a, blob)
    assert p.returncode == 2 and str(blob) in p.stderr and "text log" in p.stderr and "UTF-8" in p.stderr


def test_compare_losses_writes_its_result(tmp_path):
    a, b = _two_logs(tmp_path)
    p = _script("compare_losses.py", a, b, "--out", tmp_path / "cmp.json")
    assert p.returncode == 0, p.stderr
    assert '"passed": true' in (tmp_path / "cmp.json").read_text()
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []  # no temporary left


@pytest.mark.parametrize(
    "args,text",
    [
        (["--proxy-layers", "3"], "--proxy-layers 3"),
        (["--proxy-layers", "0"], "--proxy-layers 0"),
        (["--steps", "0"], "--steps 0"),
        (["--steps", "10"], "--window ends at step 19"),
        (["--window", "9", "4"], "--window 9 4"),
        (["--gpu", "tpu"], "--gpu tpu: unknown"),
        (["--proxy-layers", "4", "optimizer.lr=nan"], "optimizer.lr=nan"),
        (["--proxy-layers", "400"], "--proxy-layers 400"),  # the library's scale_down, as this command spells it
        (["no.such.key=1"], "no.such.key"),
    ],
)
def test_benchmark_checks_everything_before_running(tmp_path, capsys, monkeypatch, args, text):
    import bridge_recipes.bench.runs as runs

    monkeypatch.setattr(runs, "launch", lambda *a, **k: pytest.fail("a run started"))
    recipe = "qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config"
    with pytest.raises(SystemExit) as exit_:
        benchmark_main(["--recipe", recipe, "--out", str(tmp_path / "r.yaml"), *args])
    assert exit_.value.code == 2
    assert text in capsys.readouterr().err


def test_benchmark_out_folder(tmp_path, capsys):
    with pytest.raises(SystemExit):
        benchmark_main(["--recipe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config", "--out", str(tmp_path)])
    assert "is a folder" in capsys.readouterr().err
