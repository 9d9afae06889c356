"""A wheelhouse for a GPU machine without a package registry, carried in parts of a size limit.

    # on a machine with a registry: the pinned wheels the GPU machine lacks, in parts of 60 MiB
    python3 -m bridge_recipes.hardware.wheelhouse build --host-freeze host_freeze.txt --out .wheelhouse \\
        --extra-wheel ../shared/wheelhouse/transformer_engine_torch-2.20.2-cp312-cp312-linux_x86_64.whl
    # on the GPU machine, once every part is there: one folder for `install.sh --wheelhouse`
    python3 -m bridge_recipes.hardware.wheelhouse join .wheelhouse/part_* --out /tmp/wheelhouse

``host_freeze.txt`` is ``python3 -m pip list --format=freeze`` as run on the GPU machine: a pin of
requirements/cpu.lock or gpu.lock that it already satisfies (same public version; a local label
such as ``+cu130`` is ignored) is not downloaded, because ``install.sh --reuse-site-packages``
keeps it. A wheel larger than a part is cut into chunks, one part each; ``join`` puts them back
together and checks every file's SHA-256 against the manifest (``part_01/MANIFEST.json``) before
anything is written to ``--out``. Standard library only: the GPU machine runs it from the checkout's root
before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bridge_recipes.utils.outputs import file_sha256, staged_output

ROOT = Path(__file__).resolve().parents[2]
LOCKS = (ROOT / "requirements/cpu.lock", ROOT / "requirements/gpu.lock")
MANIFEST = "MANIFEST.json"
# CPython 3.12 on x86-64 Linux, newest glibc tag first (the H200 host has glibc 2.39)
PLATFORMS = ("manylinux_2_39_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# published as source only, or built for one CUDA: these come with --extra-wheel
NOT_DOWNLOADED = {"transformer-engine-torch"}
PIP = "pip>=25"  # what install.sh upgrades a new venv's pip to


class WheelhouseError(Exception):
    pass


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """``name==version`` lines (a lock file or ``pip list --format=freeze``) by normalized name;
    comments, blank lines and lines of another form (``pkg @ file://...``) are skipped; a later
    line replaces an earlier one."""
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and " @ " not in line:
            name, version = line.split("==", 1)
            out[normalize(name)] = version.strip()
    return out


def public(version: str) -> str:
    return version.split("+", 1)[0]


def unsatisfied(pins: dict[str, str], installed: dict[str, str]) -> dict[str, str]:
    """The pins the installed set does not satisfy at the same public version."""
    return {n: v for n, v in pins.items() if public(installed.get(n, "")) != public(v)}


def pack(files: list[Path], out: Path, part_bytes: int) -> dict:
    """Lay ``files`` out in ``out/part_NN`` folders of at most ``part_bytes`` each (largest first,
    each into the first part with room); a file larger than a part is cut into chunks
    ``NAME.chunkNN``, one part each. Returns the manifest, also written into part_01."""
    if part_bytes < 1024:
        raise WheelhouseError(f"a part of {part_bytes} bytes is too small")
    manifest: dict = {"part_bytes": part_bytes, "files": {}}
    pieces: list[tuple[str, Path, int, int]] = []  # (name in the part, source, offset, length)
    for f in sorted(files, key=lambda p: (-p.stat().st_size, p.name)):
        size = f.stat().st_size
        entry = {"size": size, "sha256": file_sha256(f), "chunks": []}
        if size <= part_bytes:
            pieces.append((f.name, f, 0, size))
        else:
            for i, offset in enumerate(range(0, size, part_bytes), start=1):
                chunk = f"{f.name}.chunk{i:02d}"
                entry["chunks"].append(chunk)
                pieces.append((chunk, f, offset, min(part_bytes, size - offset)))
        manifest["files"][f.name] = entry
    parts: list[list[tuple[str, Path, int, int]]] = []
    room: list[int] = []
    for piece in sorted(pieces, key=lambda p: -p[3]):
        k = next((i for i, r in enumerate(room) if r >= piece[3]), None)
        if k is None:
            parts.append([])
            room.append(part_bytes)
            k = len(parts) - 1
        parts[k].append(piece)
        room[k] -= piece[3]
    manifest["parts"] = {f"part_{i:02d}": sorted(p[0] for p in part) for i, part in enumerate(parts, start=1)}
    for i, part in enumerate(parts, start=1):
        folder = out / f"part_{i:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, src, offset, length in part:
            with open(src, "rb") as fin, open(folder / name, "wb") as fout:
                fin.seek(offset)
                fout.write(fin.read(length))
    (out / "part_01").mkdir(parents=True, exist_ok=True)
    (out / "part_01" / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def join(parts: list[Path], out: Path, overwrite: bool = False) -> list[str]:
    """Rebuild the packed files of ``parts`` into ``out``, checking sizes and SHA-256; nothing
    lands in ``out`` unless every file checks (``outputs.staged_output``: a non-empty ``out`` is
    refused without ``overwrite``). Returns the file names."""
    found = [p / MANIFEST for p in parts if (p / MANIFEST).is_file()]
    if not found:
        raise WheelhouseError(f"no {MANIFEST} in {', '.join(map(str, parts))}: pass every part, part_01 included")
    manifest = json.loads(found[0].read_text())
    where = {f.name: f for p in parts for f in p.iterdir() if f.name != MANIFEST}
    missing_parts = sorted(set(manifest["parts"]) - {p.name for p in parts})
    if missing_parts:
        raise WheelhouseError(f"parts not given (or not carried here yet): {', '.join(missing_parts)}")
    with staged_output(out, overwrite, error=WheelhouseError) as tmp:
        for name, entry in sorted(manifest["files"].items()):
            pieces = entry["chunks"] or [name]
            lost = [c for c in pieces if c not in where]
            if lost:
                raise WheelhouseError(f"{name}: missing {', '.join(lost)} (listed in {manifest['parts']})")
            with open(tmp / name, "wb") as fout:
                for c in pieces:
                    with open(where[c], "rb") as fin:
                        shutil.copyfileobj(fin, fout)
            if (tmp / name).stat().st_size != entry["size"] or file_sha256(tmp / name) != entry["sha256"]:
                raise WheelhouseError(f"{name}: size or SHA-256 differs from the manifest; carry its part again")
    return sorted(manifest["files"])


def build_sources(downloads: Path, out: Path) -> list[Path]:
    """Wheels built here from the pins published as source only (e.g. antlr4-python3-runtime 4.9.3);
    only a pure-Python result (``py3-none-any``) is kept, since a compiled one would be for this machine."""
    sources = sorted(p for p in downloads.glob("*") if p.name.endswith((".tar.gz", ".zip", ".tar.bz2")))
    for src in sources:
        print(f"[wheelhouse] {src.name} is published as source only: building a wheel")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)], check=True)
        src.unlink()
    built = sorted(out.glob("*.whl")) if sources else []
    for wheel in built:
        if not wheel.name.endswith("-none-any.whl"):
            raise WheelhouseError(
                f"{wheel.name}: built from source for this machine, not pure Python; build it on the GPU machine"
            )
    return built


def needed(installed: dict[str, str], locks: list[dict[str, str]]) -> list[dict[str, str]]:
    """What each lock needs downloaded when the locks are installed in order over ``installed``:
    a pin that neither the machine nor an earlier lock provides at that version. install.sh installs
    cpu.lock, then gpu.lock, each with --no-deps, so each lock's own versions must be in the
    wheelhouse, also where a later lock pins another version of the same package
    (apache-tvm-ffi: 0.1.15.post2 in cpu.lock, 0.1.12 in gpu.lock)."""
    state = dict(installed)
    out = []
    for pins in locks:
        out.append({n: v for n, v in unsatisfied(pins, state).items() if n not in NOT_DOWNLOADED})
        state.update(pins)
    return out


def build(host_freeze: Path, out: Path, part_mib: float, extra_wheels: list[Path], overwrite: bool = False) -> dict:
    locks = [read_pins(lock.read_text()) for lock in LOCKS]
    needs = needed(read_pins(host_freeze.read_text()), locks)
    total = len({(n, v) for lock in locks for n, v in lock.items()})
    n_need = sum(len(need) for need in needs)
    with staged_output(out, overwrite, error=WheelhouseError) as staged, tempfile.TemporaryDirectory() as dl:
        print(f"[wheelhouse] {total - n_need} of {total} pins are on the GPU machine; downloading {n_need}")
        downloads = Path(dl) / "w"
        for i, need in enumerate(needs):
            lines = [f"{n}=={v}" for n, v in sorted(need.items())]
            if i == 0:  # install.sh upgrades pip first (a fresh venv's pip may be older than it needs)
                lines.append(PIP)
            if not lines:
                continue
            req = Path(dl) / f"need_{i}.txt"
            req.write_text("".join(f"{line}\n" for line in lines))
            # a wheel where one is published for the GPU machine; else the source, built into a wheel here
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--prefer-binary", "--python-version", "3.12"]
            cmd += [a for p in PLATFORMS for a in ("--platform", p)] + ["-d", str(downloads), "-r", str(req)]
            subprocess.run(cmd, check=True)
        wheels = sorted(downloads.glob("*.whl")) + build_sources(downloads, Path(dl) / "built")
        manifest = pack(wheels + list(extra_wheels), staged, int(part_mib * 2**20))
    for part, names in manifest["parts"].items():
        size = sum((out / part / n).stat().st_size for n in names) / 2**20
        print(f"[wheelhouse] {out / part}: {len(names)} file(s), {size:.1f} MiB")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download the pins the GPU machine lacks and pack them in parts")
    b.add_argument("--host-freeze", type=Path, required=True, help="pip list --format=freeze of the GPU machine")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--part-mib", type=float, default=60.0, help="largest part (the carry limit less the tree)")
    b.add_argument("--extra-wheel", type=Path, action="append", default=[], help="a prebuilt wheel to add")
    b.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    j = sub.add_parser("join", help="rebuild the wheelhouse from its parts")
    j.add_argument("parts", type=Path, nargs="+")
    j.add_argument("--out", type=Path, required=True)
    j.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    opts = ap.parse_args(argv)
    try:
        if opts.cmd == "build":
            for w in opts.extra_wheel:
                if not w.is_file():
                    raise WheelhouseError(f"--extra-wheel {w}: no such file")
            build(opts.host_freeze, opts.out, opts.part_mib, opts.extra_wheel, opts.overwrite)
        else:
            names = join(opts.parts, opts.out, opts.overwrite)
            print(f"[wheelhouse] {len(names)} file(s) checked and joined into {opts.out}")
    except (WheelhouseError, FileNotFoundError) as exc:
        print(f"wheelhouse: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"wheelhouse: pip download exited {exc.returncode} (see its output above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
