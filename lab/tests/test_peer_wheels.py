"""The peer's wheels: each pin downloaded alone into its part, one without a wheel recorded as not
installable offline, the stack lock's version where it pins one, each part's size against its limit,
and a folder holding wheels never written over without --overwrite (pip faked: no network here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge_recipes.hardware.wheelhouse import LOCKS, normalize, read_pins
from lab.gpu import peer_wheels


def fake_pip(sizes: dict[str, int]):
    """A downloader that writes a wheel of ``sizes[name]`` bytes, or finds none for a name not there."""
    asked = []

    def fetch(name, version, dest: Path):
        asked.append((name, version))
        if name not in sizes:
            return None, f"ERROR: No matching distribution found for {name}=={version}"
        wheel = dest / f"{normalize(name).replace('-', '_')}-{version}-py3-none-any.whl"
        wheel.write_bytes(b"w" * sizes[name])
        return wheel, ""

    return fetch, asked


def test_the_parts_hold_each_pins_wheel_and_record_what_has_none(tmp_path):
    sizes = {name: 1000 for _, name, _, _ in peer_wheels.PINS if name != "causal-conv1d"}
    fetch, asked = fake_pip(sizes)
    record = peer_wheels.build(tmp_path, part_mib=1.0, fetch=fetch)
    assert [n for n, _ in asked] == [name for _, name, _, _ in peer_wheels.PINS]
    locked = read_pins(LOCKS[0].read_text())
    for name, version in asked:  # one version per host: the lock's where it pins the package
        assert version == locked.get(normalize(name), version)
    by_name = {e["name"]: e for e in record["pins"]}
    assert (
        by_name["causal-conv1d"]["wheel"] is None
        and "cannot install offline" in by_name["causal-conv1d"]["not_installable"]
    )
    for part in peer_wheels.PARTS:
        names = sorted(p.name for p in (tmp_path / part).iterdir())
        assert names == sorted(e["wheel"] for e in record["pins"] if e["part"] == part and e["wheel"])
        assert record["parts"][part]["within_limit"]
    assert (tmp_path / "peer_a" / "liger_kernel-0.8.5-py3-none-any.whl").is_file()


def test_a_part_over_its_limit_fails_and_a_filled_folder_is_kept(tmp_path, monkeypatch, capsys):
    fetch, _ = fake_pip({"unsloth": 3 * 2**20, "liger-kernel": 10})
    monkeypatch.setattr(peer_wheels, "download", fetch)
    record = tmp_path / "r.json"
    assert peer_wheels.main(["--out", str(tmp_path), "--part-mib", "2", "--record", str(record)]) == 1
    doc = json.loads(record.read_text())
    assert doc["parts"]["peer_b"] == {"mib": 3.0, "within_limit": False} and doc["parts"]["peer_a"]["within_limit"]
    kept = (tmp_path / "peer_a" / "liger_kernel-0.8.5-py3-none-any.whl").read_bytes()
    assert peer_wheels.main(["--out", str(tmp_path)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "peer_a" / "liger_kernel-0.8.5-py3-none-any.whl").read_bytes() == kept
    with pytest.raises(SystemExit) as exc:  # an existing record is not written over either
        peer_wheels.main(["--out", str(tmp_path / "other"), "--record", str(record)])
    assert exc.value.code == 2
    assert peer_wheels.main(["--out", str(tmp_path), "--part-mib", "4", "--overwrite"]) == 0
