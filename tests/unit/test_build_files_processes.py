"""The data builders' output folder and processes: one build at a time into an --out, a folder
that changed during the build left alone, file system errors and odd --out paths reported in a
line, Ctrl-C stopping a build and its workers quietly, the VL builder's workers, progress lines."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.data import row_writer, sft_rows
from bridge_recipes.data.synthetic_chat import conversations_jsonl
from bridge_recipes.vl import vl_dataset, vl_processor
from bridge_recipes.vl.synthetic_images import write_conversations

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests/fixtures/qwen35_chat_tokenizer"
ROW = 2048
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("chats") / "c.jsonl"
    path.write_text(conversations_jsonl(40))
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_conversations(tmp_path_factory.mktemp("images"), 12, seed=1)


@pytest.fixture(scope="module")
def toy(tiny_vl_toy):
    return tiny_vl_toy[0]


@pytest.fixture(params=["sft", "vl"])
def builder(request, chats, images, capsys):
    """(kind, build(out, **kw), cli(out, *flags) -> (exit status, stderr), the input, the library's error type).
    The SFT command line runs as a process, the VL one in this process."""
    if request.param == "sft":

        def build(out, **kw):
            kw.setdefault("workers", 1)
            return sft_rows.build_sft_rows(chats, TOKENIZER, out, row_tokens=ROW, progress=False, **kw)

        def cli(out, *extra):
            args = ["--input", chats, "--tokenizer", TOKENIZER, "--out", out, "--row-tokens", ROW, "--workers", 1]
            script = ROOT / "scripts/build_sft_rows.py"
            p = subprocess.run(
                [sys.executable, str(script), *map(str, (*args, *extra))],
                capture_output=True,
                text=True,
                env=ENV,
                cwd=os.getcwd(),
            )
            return p.returncode, p.stderr

        return "sft", build, cli, chats, SftRowsError
    toy = request.getfixturevalue("toy")

    def build(out, **kw):
        kw.setdefault("workers", 1)
        return vl_dataset.build_vl_dataset(images, toy, out, progress=False, **kw)

    def cli(out, *extra):
        from bridge_recipes.vl.vl_cli import main

        capsys.readouterr()
        code = main([str(a) for a in ("--input", images, "--processor", toy, "--out", out, "--workers", 1, *extra)])
        return code, capsys.readouterr().err

    return "vl", build, cli, images, vl_processor.VlDatasetError


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- one build at a time

HOLD_LOCK = """
import sys, time
from pathlib import Path
from bridge_recipes.data.row_writer import OutputLock
OutputLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_build_into_the_same_out_is_refused_naming_the_running_one(builder, tmp_path):
    kind, build, cli, _, error = builder
    out = tmp_path / "ds"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(error, match=rf"another build \(pid {holder.pid}"):
            build(out)
        code, err = cli(out, "--no-progress")
        assert code == 2 and "error:" in err and str(holder.pid) in err and "Traceback" not in err
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    # the killed holder's lock file is taken over, and the finished build removes it
    assert row_writer.lock_path(out).exists()
    build(out)
    assert (out / "manifest.json").is_file() and _leftovers(tmp_path) == []


def test_a_lock_file_of_a_dead_build_is_taken_over(builder, tmp_path):
    kind, build, *_ = builder
    out = tmp_path / "ds"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    row_writer.lock_path(out).write_text(dead.stdout)
    build(out)
    assert (out / "manifest.json").is_file() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_written_into_out_during_the_build_is_kept(builder, tmp_path, monkeypatch, overwrite):
    kind, build, _, _, error = builder
    out = tmp_path / "ds"
    if overwrite:
        build(out)
    before = _tree(out) if overwrite else {}
    publish = row_writer.StagedBuild.publish

    def user_writes_then_publish(self):
        self.out.mkdir(exist_ok=True)
        (self.out / "notes.txt").write_text("mine")
        publish(self)

    monkeypatch.setattr(row_writer.StagedBuild, "publish", user_writes_then_publish)
    with pytest.raises(error, match=r"changed while the build ran .*notes\.txt.*ds\.new"):
        build(out, overwrite=overwrite)
    assert _tree(out) == {**before, "notes.txt": b"mine"}  # nothing of it replaced or removed
    assert (tmp_path / "ds.new" / "manifest.json").is_file()  # the new dataset, kept beside it
    assert _leftovers(tmp_path) == []


# --------------------------------------------------------------------------- disk full, odd --out paths


def _full_disk(kind, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if kind == "sft":
        monkeypatch.setattr(pq.ParquetWriter, "write_table", no_space)
    else:
        monkeypatch.setattr(tarfile.TarFile, "addfile", no_space)


def test_a_full_disk_is_an_error_that_keeps_the_previous_dataset(builder, tmp_path, monkeypatch):
    kind, build, cli, _, error = builder
    out = tmp_path / "ds"
    build(out)
    before = _tree(out)
    _full_disk(kind, monkeypatch)
    with pytest.raises(error, match="no space left"):
        build(out, overwrite=True)
    assert _tree(out) == before and _leftovers(tmp_path) == []
    if kind == "vl":  # the command line, in this process (the SFT one turns the same error into exit 2)
        code, err = cli(out, "--overwrite", "--no-progress")
        assert code == 2 and "error:" in err and "no space left" in err and "Traceback" not in err
        assert _tree(out) == before and _leftovers(tmp_path) == []


def test_a_dangling_link_as_out_is_refused(builder, tmp_path):
    kind, build, cli, *_ = builder
    link = tmp_path / "ds"
    link.symlink_to(tmp_path / "nowhere")
    code, err = cli(link, "--no-progress")
    assert code == 2 and "error:" in err and "--out" in err and "does not exist" in err and "Traceback" not in err
    assert link.is_symlink() and not (tmp_path / "nowhere").exists() and _leftovers(tmp_path) == []


def test_a_link_to_a_folder_as_out_builds_in_that_folder(builder, tmp_path):
    kind, build, *_ = builder
    (tmp_path / "real").mkdir()
    (tmp_path / "ds").symlink_to(tmp_path / "real")
    build(tmp_path / "ds")
    assert (tmp_path / "ds").is_symlink() and (tmp_path / "real" / "manifest.json").is_file()


@pytest.mark.parametrize("where", ["current folder", "above the current folder", "folder holding the input"])
def test_out_that_would_replace_the_current_or_input_folder_is_refused(builder, tmp_path, monkeypatch, where):
    kind, build, cli, source, _ = builder
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    (here / "mine.txt").write_text("mine")
    if where == "folder holding the input":
        monkeypatch.chdir(here)
        out = source.parent
    else:
        monkeypatch.chdir(here if where == "current folder" else here / "sub")
        out = Path(".") if where == "current folder" else Path("..")
    before, inputs = _tree(tmp_path), _tree(source.parent)
    code, err = cli(out, "--overwrite", "--no-progress")
    assert code == 2 and "error:" in err and "--out" in err and "Traceback" not in err
    assert ("holds --input" if where == "folder holding the input" else where) in err
    assert _tree(tmp_path) == before and _tree(source.parent) == inputs


# --------------------------------------------------------------------------- Ctrl-C


def _interrupt(cmd: list[str], out: Path, started: str) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a process group of its own, wait for ``started`` (a glob under its staging folder), press
    Ctrl-C (SIGINT to the whole group, as a terminal does); the build must stop within a timeout."""
    # Ctrl-C as in a terminal: a test run started in the background of a shell without job control
    # would hand the build an ignored SIGINT (and Python then installs no KeyboardInterrupt)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 300
        while not list(out.parent.glob(f".{out.name}.tmp-*/{started}")):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the build did not start"
            time.sleep(0.05)
        time.sleep(0.5)  # workers busy
        assert proc.poll() is None, "the build finished before it could be interrupted: give it more input"
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def many_chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("many") / "c.jsonl"
    path.write_text(conversations_jsonl(20_000))
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_stops_the_sft_build_in_a_line(many_chats, tmp_path, workers):
    out = tmp_path / "rows"
    cmd = [sys.executable, str(ROOT / "scripts/build_sft_rows.py"), "--input", str(many_chats), "--tokenizer",
           str(TOKENIZER), "--out", str(out), "--row-tokens", str(ROW), "--workers", str(workers)]  # fmt: skip
    result = _interrupt(cmd, out, "rows.parquet")
    assert result.returncode == 130, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr
    assert re.search(rf"interrupted\b.*{re.escape(str(out))}", result.stderr), result.stderr[-3000:]
    assert not out.exists() and _leftovers(tmp_path) == []


def test_ctrl_c_stops_the_vl_build_and_its_workers(toy, tmp_path):
    src = write_conversations(tmp_path / "data", 1500, seed=2)
    out = tmp_path / "ds"
    cmd = [sys.executable, str(ROOT / "scripts/build_vl_dataset.py"), "--input", str(src), "--processor", str(toy),
           "--out", str(out), "--workers", "2", "--samples-per-shard", "50"]  # fmt: skip
    result = _interrupt(cmd, out, "train-000000.tar")
    assert result.returncode == 130, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr
    assert re.search(rf"interrupted\b.*{re.escape(str(out))}", result.stderr), result.stderr[-3000:]
    assert not out.exists() and _leftovers(tmp_path) == []


# --------------------------------------------------------------------------- VL workers, progress


def test_the_vl_dataset_is_the_same_whatever_the_workers(toy, tmp_path, monkeypatch):
    src = write_conversations(tmp_path / "data", 30, seed=4)
    lines = src.read_text().splitlines()
    lines[5] = "{broken"  # skipped ones among them, a chunk boundary between them
    lines[9] = json.dumps({"messages": [{"role": "user", "content": "<image> hi"}, {"role": "assistant",
                          "content": "x"}], "images": ["images/nowhere.png"]})  # fmt: skip
    src.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(vl_dataset, "WORK_CHUNK", 3)
    one = vl_dataset.build_vl_dataset(src, toy, tmp_path / "one", val_fraction=0.2, samples_per_shard=5,
                                      progress=False, workers=1)  # fmt: skip
    two = vl_dataset.build_vl_dataset(src, toy, tmp_path / "two", val_fraction=0.2, samples_per_shard=5,
                                      progress=False, workers=2)  # fmt: skip
    assert one["conversations"]["skipped_total"] == 2 and one["conversations"]["used"] == 28
    assert two == one
    for name in ["samples.parquet", *(s["file"] for split in one["splits"].values() for s in split["shards"])]:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


@pytest.mark.parametrize("workers", [0, -1, True])
def test_a_vl_worker_count_below_one_is_refused(toy, images, tmp_path, workers):
    with pytest.raises(vl_processor.VlDatasetError, match="--workers .*at least 1"):
        vl_dataset.build_vl_dataset(images, toy, tmp_path / "ds", progress=False, workers=workers)


RATE_AND_ETA = re.compile(r"\d+/\d+ \[\d+:\d+<\d+:\d+, +[\d.]+(conv/s|s/conv)")


def test_progress_shows_conversations_a_second_and_the_time_left(builder, tmp_path):
    kind, build, cli, *_ = builder
    code, err = cli(tmp_path / "ds")
    assert code == 0 and RATE_AND_ETA.search(err)
    code, err = cli(tmp_path / "ds2", "--no-progress")
    assert code == 0 and not RATE_AND_ETA.search(err) and "it/s" not in err and "%|" not in err
