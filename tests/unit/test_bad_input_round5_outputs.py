"""--overwrite replaces only a folder a command wrote itself: never a folder of the user's, the
current folder, a folder above it, or one holding an input; every command that writes a folder
goes through the one staging step (bridge_recipes.utils.outputs.staged_output)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from bridge_recipes.utils.outputs import OUTPUT_MARKER, staged_output, written_here


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _users_folder(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "notes.txt").write_text("my notes")
    (path / "sub" / "data.bin").write_bytes(b"\x00\x01")
    return path


def test_a_users_folder_is_not_replaced_with_overwrite(tmp_path):
    out = _users_folder(tmp_path / "mine")
    before = _tree(tmp_path)
    with pytest.raises(OSError, match="did not write") as exc, staged_output(out, overwrite=True) as tmp:
        (tmp / "x").write_text("new")
    assert "notes.txt" in str(exc.value) and "--out" in str(exc.value)
    assert _tree(tmp_path) == before


def test_a_folder_written_by_the_tool_is_replaced_with_overwrite(tmp_path):
    out = tmp_path / "made"
    with staged_output(out) as tmp:
        (tmp / "a").write_text("first")
    assert written_here(out) and (out / OUTPUT_MARKER).is_file()
    with staged_output(out, overwrite=True) as tmp:
        (tmp / "b").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == sorted([OUTPUT_MARKER, "b"])


@pytest.mark.parametrize("where", ["current folder", "above the current folder"])
def test_the_current_folder_and_those_above_are_never_replaced(tmp_path, monkeypatch, where):
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    with staged_output(here / "x"):
        pass
    marker_copy = (here / "x" / OUTPUT_MARKER).read_bytes()
    (here / OUTPUT_MARKER).write_bytes(marker_copy)  # even a folder that looks like ours
    monkeypatch.chdir(here if where == "current folder" else here / "sub")
    before = _tree(tmp_path)
    with pytest.raises(OSError, match=where), staged_output("." if where == "current folder" else "..", True):
        pass
    assert _tree(tmp_path) == before


def test_a_folder_holding_an_input_is_never_replaced(tmp_path):
    with staged_output(tmp_path / "made") as tmp:
        (tmp / "tokenizer.json").write_text("{}")
    before = _tree(tmp_path)
    inputs = [("--tokenizer-json", tmp_path / "made" / "tokenizer.json")]
    with pytest.raises(OSError, match="holds --tokenizer-json"), staged_output(tmp_path / "made", True, inputs=inputs):
        pass
    assert _tree(tmp_path) == before


def _convert(argv: list[str]) -> tuple[int, str]:
    from bridge_recipes.hf.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["toy", "--out", "{out}", "--overwrite"],
        ["import", "--hf", "{src}", "--recipe", "qwen35_35b_a3b", "--scaled", "--out", "{out}", "--overwrite"],
    ],
    ids=["toy", "import"],
)
def test_converter_overwrite_keeps_a_users_folder(tmp_path, argv):
    out = _users_folder(tmp_path / "mine")
    src = tmp_path / "src"
    src.mkdir()
    before = _tree(tmp_path)
    code, err = _convert([a.format(out=out, src=src) for a in argv])
    assert code == 2 and "Traceback" not in err and "notes.txt" in err, err
    assert _tree(tmp_path) == before


def test_converter_refuses_the_current_folder(tmp_path, monkeypatch):
    _users_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    code, err = _convert(["toy", "--out", ".", "--overwrite"])
    assert code == 2 and "current folder" in err and "Traceback" not in err
    assert _tree(tmp_path) == before
