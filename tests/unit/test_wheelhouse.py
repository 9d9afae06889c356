"""bridge_recipes.hardware.wheelhouse: which pins a GPU machine lacks, packing wheels into parts under a
carry limit (a wheel larger than a part cut into chunks) and joining them back with checksums;
scripts/install.sh --reuse-site-packages and several --wheelhouse folders (dry run)."""

import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.hardware import wheelhouse as wh

ROOT = Path(__file__).resolve().parents[2]


def test_pins_a_machine_satisfies_ignore_the_local_label():
    pins = wh.read_pins(
        "torch==2.11.0\nTransformers==5.12.1  # note\napache_tvm_ffi==0.1.15\napache-tvm-ffi==0.1.12\n"
    )
    assert pins == {"torch": "2.11.0", "transformers": "5.12.1", "apache-tvm-ffi": "0.1.12"}  # the later pin wins
    host = wh.read_pins("torch==2.11.0+cu130\ntransformers==5.17.0\nmyproj @ file:///src\n")
    assert host == {"torch": "2.11.0+cu130", "transformers": "5.17.0"}
    assert wh.unsatisfied(pins, host) == {"transformers": "5.12.1", "apache-tvm-ffi": "0.1.12"}


def _files(tmp_path, sizes):
    src = tmp_path / "src"
    src.mkdir()
    out = []
    for i, size in enumerate(sizes):
        f = src / f"w{i}-1.0-py3-none-any.whl"
        f.write_bytes(os.urandom(size))
        out.append(f)
    return out


def test_pack_keeps_every_part_under_the_limit_and_join_restores_the_bytes(tmp_path):
    files = _files(tmp_path, [5000, 1500, 700, 300, 2048])
    manifest = wh.pack(files, tmp_path / "wh", 2048)
    parts = sorted((tmp_path / "wh").iterdir())
    assert [p.name for p in parts] == sorted(manifest["parts"])
    for p in parts:  # the manifest itself is not a carried wheel byte
        assert sum(f.stat().st_size for f in p.iterdir() if f.name != wh.MANIFEST) <= 2048
    assert manifest["files"]["w0-1.0-py3-none-any.whl"]["chunks"] == [
        f"w0-1.0-py3-none-any.whl.chunk{i:02d}" for i in (1, 2, 3)
    ]
    # 5000 = 2048 + 2048 + 904 in three parts with the 2048 file; then 1500 + 300 and 904 + 700
    assert len(parts) == 5
    names = wh.join(parts, tmp_path / "joined")
    assert names == sorted(f.name for f in files)
    for f in files:
        assert (tmp_path / "joined" / f.name).read_bytes() == f.read_bytes()


def test_join_refuses_a_missing_part_a_damaged_chunk_and_a_used_folder(tmp_path):
    files = _files(tmp_path, [5000, 100])
    wh.pack(files, tmp_path / "wh", 2048)
    parts = sorted((tmp_path / "wh").iterdir())
    with pytest.raises(wh.WheelhouseError, match="parts not given .*part_03"):
        wh.join(parts[:2], tmp_path / "a")
    chunk = tmp_path / "wh" / "part_02" / next(n for n in os.listdir(parts[1]) if "chunk" in n)
    data = chunk.read_bytes()
    chunk.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # a changed first byte, whatever it was
    with pytest.raises(wh.WheelhouseError, match="w0-1.0-py3-none-any.whl: size or SHA-256 differs"):
        wh.join(parts, tmp_path / "b")
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())  # nothing half-written
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "mine.txt").write_text("a user's file")
    with pytest.raises(wh.WheelhouseError, match="is not empty"):
        wh.join(parts, tmp_path / "c")
    assert wh.main(["join", str(parts[1]), "--out", str(tmp_path / "d")]) == 2  # no manifest: part_01 left out


def test_each_lock_gets_its_own_versions_installed_in_order():
    host = {"torch": "2.11.0+cu130", "transformers": "5.17.0"}
    cpu = {
        "torch": "2.11.0",
        "transformers": "5.12.1",
        "apache-tvm-ffi": "0.1.15.post2",
        "transformer-engine-torch": "2",
    }
    gpu = {"apache-tvm-ffi": "0.1.12", "transformers": "5.12.1", "tilelang": "0.1.15"}
    # cpu.lock's tvm-ffi is installed first, then gpu.lock's replaces it: both must be carried;
    # gpu.lock's transformers is cpu.lock's (installed by then); TE's extension comes with --extra-wheel
    assert wh.needed(host, [cpu, gpu]) == [
        {"transformers": "5.12.1", "apache-tvm-ffi": "0.1.15.post2"},
        {"apache-tvm-ffi": "0.1.12", "tilelang": "0.1.15"},
    ]


def _fake_pip(asked, wheel_name=None):
    """subprocess.run for build(): `pip download -r` writes a wheel a line (a source archive for
    the names in asked["sources"]), `pip wheel` writes ``wheel_name``."""

    def fake_run(cmd, check):
        if "wheel" in cmd:
            out = Path(cmd[cmd.index("-w") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / wheel_name).write_bytes(b"b" * 10)
            asked.setdefault("built", []).append(Path(cmd[-1]).name)
            return subprocess.CompletedProcess(cmd, 0)
        req = Path(cmd[cmd.index("-r") + 1]).read_text().split()
        asked.setdefault("req", []).append(req)
        dest = Path(cmd[cmd.index("-d") + 1])
        dest.mkdir(parents=True, exist_ok=True)
        for line in req:
            name = line.split("=")[0].replace(">", "")
            suffix = ".tar.gz" if name in asked.get("sources", ()) else "-1-py3-none-any.whl"
            (dest / f"{name}{suffix}").write_bytes(b"w" * 100)
        return subprocess.CompletedProcess(cmd, 0)

    return fake_run


def test_build_downloads_only_what_the_machine_lacks(tmp_path, monkeypatch, capsys):
    freeze = tmp_path / "freeze.txt"
    cpu = wh.read_pins((ROOT / "requirements/cpu.lock").read_text())
    gpu = wh.read_pins((ROOT / "requirements/gpu.lock").read_text())
    host = {**cpu, "transformers": "0.0.0"}
    freeze.write_text("".join(f"{n}=={v}+cu130\n" for n, v in host.items()))
    asked = {}
    monkeypatch.setattr(wh.subprocess, "run", _fake_pip(asked))
    te = tmp_path / "transformer_engine_torch-2.20.2-cp312-cp312-linux_x86_64.whl"
    te.write_bytes(b"t" * 3000)
    manifest = wh.build(freeze, tmp_path / "wh", 2048 / 2**20, [te])
    # one download per lock, in install order: cpu.lock's missing transformers and pip, then what
    # gpu.lock adds or pins at another version than cpu.lock
    assert asked["req"][0] == [f"transformers=={cpu['transformers']}", wh.PIP]
    assert set(asked["req"][1]) == {f"{n}=={v}" for n, v in gpu.items() if cpu.get(n) != v}
    assert te.name in manifest["files"] and manifest["files"][te.name]["chunks"]  # 3000 bytes over a 2048 part
    assert "of" in capsys.readouterr().out


def test_build_turns_a_source_only_pin_into_a_pure_python_wheel(tmp_path, monkeypatch):
    freeze = tmp_path / "freeze.txt"
    cpu = wh.read_pins((ROOT / "requirements/cpu.lock").read_text())
    gpu = wh.read_pins((ROOT / "requirements/gpu.lock").read_text())
    freeze.write_text("".join(f"{n}=={v}\n" for n, v in {**cpu, **gpu}.items() if n != "antlr4-python3-runtime"))
    asked = {"sources": {"antlr4-python3-runtime"}}
    monkeypatch.setattr(wh.subprocess, "run", _fake_pip(asked, "antlr4_python3_runtime-4.9.3-py3-none-any.whl"))
    manifest = wh.build(freeze, tmp_path / "wh", 1.0, [])
    assert asked["built"] == ["antlr4-python3-runtime.tar.gz"]
    assert "antlr4_python3_runtime-4.9.3-py3-none-any.whl" in manifest["files"]
    assert not any(n.endswith(".tar.gz") for n in manifest["files"])
    # a compiled result would be for this machine, not the GPU machine: refused, nothing written
    monkeypatch.setattr(
        wh.subprocess, "run", _fake_pip(asked, "antlr4_python3_runtime-4.9.3-cp312-cp312-linux_x86_64.whl")
    )
    with pytest.raises(wh.WheelhouseError, match="not pure Python"):
        wh.build(freeze, tmp_path / "wh2", 1.0, [])
    assert not (tmp_path / "wh2").exists()


def _install(tmp_path, *args):
    """install.sh --dry-run from a copy of the checkout's script and locks (no .venv there yet)."""
    checkout = tmp_path / "checkout"
    for rel in ("scripts/install.sh", "requirements/cpu.lock", "requirements/gpu.lock"):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, checkout / rel)
    return subprocess.run(
        ["bash", str(checkout / "scripts/install.sh"), "--python", sys.executable, "--dry-run", "--cpu", *args],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip


def test_install_reuses_site_packages_and_reads_several_wheelhouses(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    p = _install(tmp_path, "--reuse-site-packages", "--wheelhouse", str(a), "--wheelhouse", str(b))
    assert p.returncode == 0, p.stderr
    pth = next(line for line in p.stdout.splitlines() if line.startswith("+ write "))
    assert "_reused_site_packages.pth" in pth and site.getsitepackages()[0] in pth
    lock_line = next(line for line in p.stdout.splitlines() if "-r .venv/install/cpu-stack.lock" in line)
    assert f"--find-links {a} --find-links {b}" in lock_line
    pip_line = next(line for line in p.stdout.splitlines() if "pip>=25" in line)
    assert f"--find-links {a}" in pip_line  # a machine without a registry upgrades pip from the wheelhouse
    # the CUDA libraries Transformer Engine looks for under the venv itself are linked in after pip ran
    lines = p.stdout.splitlines()
    nvidia = Path(site.getsitepackages()[0]) / "nvidia"
    links = [i for i, line in enumerate(lines) if line.startswith("+ ln -s ") and str(nvidia) in line]
    assert len(links) == (len(list(nvidia.iterdir())) if nvidia.is_dir() else 0)
    if links:
        assert lines.index(lock_line) < links[0] < next(i for i, x in enumerate(lines) if x.endswith("-e ."))
    assert "_reused_site" not in _install(tmp_path, "--wheelhouse", str(a)).stdout
    bad = _install(tmp_path, "--wheelhouse", str(tmp_path / "nope"))
    assert bad.returncode == 2 and f"--wheelhouse '{tmp_path / 'nope'}'" in bad.stderr and "not a folder" in bad.stderr


def test_join_runs_on_a_bare_interpreter_from_the_checkout(tmp_path):
    """The GPU machine joins the parts before anything is installed: `python3 -m
    bridge_recipes.hardware.wheelhouse join` from the checkout's root with the standard library only."""
    files = _files(tmp_path, [3000, 10])
    wh.pack(files, tmp_path / "wh", 2048)
    parts = [str(p) for p in sorted((tmp_path / "wh").iterdir())]
    cmd = [
        sys.executable,
        "-S",
        "-m",
        "bridge_recipes.hardware.wheelhouse",
        "join",
        *parts,
        "--out",
        str(tmp_path / "j"),
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert re.search(rf"\b2 file\(s\) checked\b.*{re.escape(str(tmp_path / 'j'))}", p.stdout), p.stdout
