"""One bad input line is counted and skipped, never fatal; bad arguments are clear errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.data import sft_rows

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests/fixtures/chatml_tokenizer.json"
GOOD = {
    "messages": [
        {"role": "user", "content": "what is the capital of france, and why is it there?"},
        {"role": "assistant", "content": "paris; the river seine made it a crossing and a port long ago."},
    ]
}
BAD_LINES = {
    # nested deeper than Python's JSON parser goes, yet short enough for a 64-token row to be read
    "invalid_json": ["{not json", '{"messages":' + "[" * 2_000 + "]" * 2_000 + "}"],
    "invalid_text": ['{"messages":[{"role":"user","content":"\\ud800"},{"role":"assistant","content":"ok"}]}'],
}


def _write_input(path: Path, good: int = 40) -> Path:
    lines = [json.dumps(GOOD)] * good + [line for lines in BAD_LINES.values() for line in lines]
    path.write_text("\n".join(lines) + "\n")
    return path


def _build(tmp_path, **kw):
    return sft_rows.build_sft_rows(
        _write_input(tmp_path / "in.jsonl"),
        TOKENIZER,
        tmp_path / "rows",
        row_tokens=64,
        chat_format="chatml",
        packing="eos_joined",
        progress=False,
        **kw,
    )


def test_bad_lines_are_counted_and_skipped(tmp_path):
    manifest = _build(tmp_path)
    counts = manifest["conversations"]
    assert counts["used"] == 40
    for reason, lines in BAD_LINES.items():
        assert counts["skipped"][reason] == len(lines), counts


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_out_of_range(tmp_path, seed):
    with pytest.raises(SftRowsError, match="seed must be in"):
        _build(tmp_path, seed=seed)


def test_output_that_cannot_be_created(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SftRowsError, match=r"cannot create .*file.*choose a writable --out"):
        sft_rows.build_sft_rows(
            _write_input(tmp_path / "in.jsonl"),
            TOKENIZER,
            tmp_path / "file" / "sub" / "rows",
            row_tokens=64,
            chat_format="chatml",
            packing="eos_joined",
            progress=False,
        )
    assert (tmp_path / "file").read_text() == "x"


def test_script_exits_2_without_traceback(tmp_path):
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts/build_sft_rows.py"), "--input", str(_write_input(tmp_path / "in.jsonl"))]
        + ["--tokenizer", str(TOKENIZER), "--chat-format", "chatml", "--packing", "eos_joined", "--row-tokens", "64"]
        + ["--out", str(tmp_path / "rows"), "--seed", "-1", "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "seed" in p.stderr and "[0, 2**32)" in p.stderr and "got -1" in p.stderr
    assert not (tmp_path / "rows").exists()


@pytest.mark.parametrize("nested", [False, True])
def test_rows_longer_than_the_context_window_are_refused(tmp_path, nested):
    import shutil

    folder = tmp_path / "checkpoint"
    shutil.copytree(ROOT / "tests/fixtures/qwen35_chat_tokenizer", folder)
    window = {"max_position_embeddings": 4096}
    (folder / "config.json").write_text(json.dumps({"text_config": window} if nested else window))
    build = dict(row_tokens=8192, progress=False)
    refused = "context window: .* max_position_embeddings 4096; use --row-tokens 4096"
    with pytest.raises(SftRowsError, match=refused):
        sft_rows.build_sft_rows(_write_input(tmp_path / "in.jsonl"), folder, tmp_path / "rows", **build)
    assert not (tmp_path / "rows").exists()
    assert (
        sft_rows.build_sft_rows(
            _write_input(tmp_path / "in.jsonl"), folder, tmp_path / "rows", row_tokens=4096, progress=False
        )["row_tokens"]
        == 4096
    )
