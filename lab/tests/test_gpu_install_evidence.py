"""lab/evidence/gpu_install: the committed record of `scripts/install.sh --gpu --reuse-site-packages
--wheelhouse DIR` on the H200 host agrees with requirements/cpu.lock and gpu.lock: the
versions the install printed are the pinned ones, the installed venv satisfies every pin, and the
wheelhouse build asks for both apache-tvm-ffi versions (the first attempt's failure) and for nothing
the host already had."""

import re
from pathlib import Path

from bridge_recipes.hardware.wheelhouse import needed, normalize, public, read_pins

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "lab/evidence/gpu_install"
# Pins added to cpu.lock after the recorded install (the type checker and what it needs): the next
# recorded install has them; until then they are the only pins the record may lack.
ADDED_AFTER_THE_RECORD = {"mypy", "librt", "ast-serialize"}
PRINTED = ("torch", "transformer-engine", "megatron-core", "megatron-bridge", "nvidia-resiliency-ext", "tilelang")


def _locks() -> tuple[dict[str, str], dict[str, str]]:
    return (
        read_pins((ROOT / "requirements/cpu.lock").read_text()),
        read_pins((ROOT / "requirements/gpu.lock").read_text()),
    )


def _installed_pins() -> dict[str, str]:
    """The pins as install.sh installs them: cpu.lock, then gpu.lock replacing."""
    cpu, gpu = _locks()
    return {**cpu, **gpu}


def test_install_log_ends_with_the_h200_and_the_pinned_versions():
    lines = [line for line in (EVIDENCE / "h200_install.log").read_text().splitlines() if line.strip()]
    gpu_line, versions_line = lines[-2:]
    assert re.fullmatch(r"\[install\] gpu: NVIDIA H200 x \d+ \| CUDA [\d.]+", gpu_line), gpu_line
    assert versions_line.startswith("[install] "), versions_line
    printed = {}
    for item in versions_line.removeprefix("[install] ").split(", "):
        name, version = item.rsplit(" ", 1)
        printed[normalize(name)] = version
    assert sorted(printed) == sorted(PRINTED)
    pins = _installed_pins()
    for name in PRINTED:
        assert public(printed[name]) == public(pins[name]), (name, printed[name], pins[name])


def test_installed_venv_satisfies_every_pin():
    freeze = read_pins((EVIDENCE / "h200_venv_freeze.txt").read_text())
    pins = _installed_pins()
    # the prebuilt TE extension appears in the freeze as transformer_engine_torch==2.20.2, the same
    # normalized name as the lock's, so no pin is exempt
    assert "transformer-engine-torch" in pins and "transformer-engine-torch" in freeze
    wrong = {n: (v, freeze.get(n)) for n, v in pins.items() if public(freeze.get(n, "")) != public(v)}
    absent = {n for n, (_, installed) in wrong.items() if installed is None}
    assert absent <= ADDED_AFTER_THE_RECORD, f"locked but not installed: {sorted(absent - ADDED_AFTER_THE_RECORD)}"
    changed = {n: v for n, v in wrong.items() if n not in absent}
    assert not changed, f"pin -> (locked, in the venv): {changed}"


def test_build_from_the_host_freeze_asks_for_both_tvm_ffi_versions_and_nothing_the_host_has():
    host = read_pins((EVIDENCE / "h200_host_freeze.txt").read_text())
    cpu, gpu = _locks()
    need_cpu, need_gpu = needed(host, [cpu, gpu])
    # install.sh installs cpu.lock then gpu.lock, each with --no-deps: both versions must be carried
    assert need_cpu.get("apache-tvm-ffi") == cpu["apache-tvm-ffi"] == "0.1.15.post2"
    assert need_gpu.get("apache-tvm-ffi") == gpu["apache-tvm-ffi"] == "0.1.12"
    already = {n: v for need in (need_cpu, need_gpu) for n, v in need.items() if public(host.get(n, "")) == public(v)}
    assert not already, f"asked for although the host has them: {already}"
    assert need_cpu and need_gpu
