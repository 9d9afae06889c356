"""The wheels of the LoRA peer's configurations for a GPU host without a registry, in two parts
that each travel in one command (within the carry limit with the tree).

    python3 lab/gpu/peer_wheels.py                # .whl/peer_a (Liger), .whl/peer_b (Unsloth)
    python3 lab/gpu/peer_wheels.py --record lab/evidence/peer_wheels/download.json

Each pin of :data:`PINS` is downloaded alone (``pip download --no-deps``) as a wheel for CPython
3.12 on x86-64 Linux: a pin published without such a wheel (source only, which would need a build
on the host) is recorded as not installable offline and the others go on. Part ``peer_a`` holds
what the ``liger`` configuration needs, ``peer_b`` Unsloth and what the GPU image lacks of its
imports (bitsandbytes and xformers are left out: Unsloth imports them only for 4-bit QLoRA and its
own attention, neither of which bf16 LoRA on Qwen3.5 uses). Packages the stack's lock also pins
(datasets, dill, multiprocess) take the lock's version, so a host with the stack staged holds one
version of each. ``lab/gpu/host_env.sh`` installs every carried wheel into /tmp/site.
Exit status 0 when every part is within ``--part-mib``, 1 when pip fails otherwise or a part is
over, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from the checkout
    sys.path.insert(0, str(ROOT))

from bridge_recipes.hardware.wheelhouse import LOCKS, normalize, read_pins  # noqa: E402

# (part, distribution, version, why the peer needs it)
PINS: tuple[tuple[str, str, str, str], ...] = (
    ("peer_a", "liger-kernel", "0.8.5", "the liger configuration's kernels"),
    ("peer_a", "causal-conv1d", "1.7.0", "the Gated DeltaNet's convolution with conversation boundaries"),
    ("peer_b", "unsloth", "2026.10.9", "the unsloth configuration"),
    ("peer_b", "unsloth-zoo", "2026.10.9", "unsloth's kernels and patches"),
    ("peer_b", "trl", "1.15.0", "imported by unsloth (its newest allowed)"),
    ("peer_b", "torchao", "0.18.0", "unsloth_zoo's requirement"),
    ("peer_b", "cut-cross-entropy", "25.1.1", "unsloth_zoo's requirement"),
    ("peer_b", "msgspec", "0.22.0", "unsloth_zoo's requirement"),
    ("peer_b", "datasets", "5.2.0", "imported by trl and unsloth"),
    ("peer_b", "dill", "0.4.1", "datasets' requirement"),
    ("peer_b", "multiprocess", "0.70.19", "datasets' requirement"),
)
PARTS = ("peer_a", "peer_b")
# CPython 3.12 on x86-64 Linux, newest glibc tag first (the GPU hosts have glibc 2.39), and pure Python
PLATFORMS = (
    "manylinux_2_39_x86_64",
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "any",
)
CARRY_MIB = 64  # what one command carries, tree included
TREE_MIB = 10  # about what the working tree takes of it
NO_WHEEL = "no wheel for CPython 3.12 on x86-64 Linux: cannot install offline"


class WheelsError(Exception):
    """Bad input (exit 2)."""


def pins() -> list[tuple[str, str, str, str]]:
    """:data:`PINS`, each at the stack lock's version where a lock pins it (one version per host)."""
    locked: dict[str, str] = {}
    for lock in LOCKS:
        locked.update(read_pins(lock.read_text()))
    return [(part, name, locked.get(normalize(name), version), why) for part, name, version, why in PINS]


def download(name: str, version: str, dest: Path) -> tuple[Path | None, str]:
    """The wheel of ``name==version`` downloaded into ``dest`` (None when there is none), and pip's
    last line."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp"]
    cmd += [a for p in PLATFORMS for a in ("--platform", p)] + ["-d", str(dest), f"{name}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(f"{normalize(name).replace('-', '_')}-{version}-*.whl"))
    last = ([ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.startswith("ERROR")] or [""])[-1]
    return (found[0] if proc.returncode == 0 and found else None), last


def build(out: Path, part_mib: float, overwrite: bool = False, fetch=download) -> dict:
    """Download :func:`pins` into ``out/<part>`` and return the record: each pin's file and size or
    why it has none, and each part's size against ``part_mib``."""
    folders = [out / part for part in PARTS]
    taken = [f for f in folders if f.is_dir() and any(f.iterdir())]
    if taken and not overwrite:
        raise WheelsError(f"{taken[0]} is not empty: pass --overwrite to replace its wheels, or another --out")
    record: dict = {"part_mib_limit": part_mib, "pins": [], "parts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for part, name, version, why in pins():
            wheel, said = fetch(name, version, Path(tmp))
            entry = {"part": part, "name": name, "version": version, "why": why}
            if wheel is None:
                entry["wheel"] = None
                entry["not_installable"] = f"{NO_WHEEL} (pip: {said})" if said else NO_WHEEL
            else:
                entry.update(wheel=wheel.name, mib=round(wheel.stat().st_size / 2**20, 2))
            record["pins"].append(entry)
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("*.whl"):
                old.unlink()  # --overwrite: the part's wheels of an earlier download
        for entry in record["pins"]:
            if entry["wheel"]:
                (Path(tmp) / entry["wheel"]).replace(out / entry["part"] / entry["wheel"])
    for part in PARTS:
        mib = sum(e["mib"] for e in record["pins"] if e["part"] == part and e["wheel"])
        record["parts"][part] = {"mib": round(mib, 2), "within_limit": mib <= part_mib}
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".whl", help="where the part folders go (default .whl)")
    ap.add_argument(
        "--part-mib",
        type=float,
        default=CARRY_MIB - TREE_MIB - 4,
        help=f"largest part (default: the {CARRY_MIB} MiB carry less the tree and a margin)",
    )
    ap.add_argument("--record", type=Path, help="also write the record (JSON) here")
    ap.add_argument("--overwrite", action="store_true", help="replace the wheels of non-empty part folders")
    opts = ap.parse_args(argv)
    if not opts.part_mib > 0:
        ap.error(f"--part-mib {opts.part_mib:g}: a positive number of MiB")
    if opts.record is not None and opts.record.exists() and not opts.overwrite:
        ap.error(f"--record {opts.record}: exists; pass --overwrite to replace it, or another file")
    try:
        record = build(opts.out, opts.part_mib, opts.overwrite, fetch=download)
    except WheelsError as exc:
        print(f"peer_wheels: {exc}", file=sys.stderr)
        return 2
    for entry in record["pins"]:
        got = f"{entry['wheel']} ({entry['mib']} MiB)" if entry["wheel"] else entry["not_installable"]
        print(f"[peer_wheels] {entry['part']}: {entry['name']}=={entry['version']}: {got}")
    for part, info in record["parts"].items():
        print(f"[peer_wheels] {opts.out / part}: {info['mib']} MiB (limit {opts.part_mib:g})")
    if opts.record is not None:
        opts.record.parent.mkdir(parents=True, exist_ok=True)
        opts.record.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if all(p["within_limit"] for p in record["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
