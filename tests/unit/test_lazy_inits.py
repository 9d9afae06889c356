"""The dry run's deferred package bodies (bridge_recipes.patches.lazy_inits): every re-exported name is
found where the map says, a process with the bodies deferred builds every recipe's committed config and
passes the dry run without importing the other model bridges, and AutoBridge still sees every bridge."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.patches import lazy_inits

ROOT = Path(__file__).resolve().parents[2]
OTHER_BRIDGE = "megatron.bridge.models.bailing.bailing_moe2_bridge"


def _in_a_dry_run_process(code: str) -> dict:
    """Run ``code`` in a fresh interpreter after install(); it leaves its findings in ``out``."""
    script = "\n".join(
        [
            "import json, sys",
            "from bridge_recipes.patches import lazy_inits",
            "out = {'installed': lazy_inits.install()}",
            code,
            "out['deferred'] = lazy_inits.deferred()",
            f"out['other_bridge'] = {OTHER_BRIDGE!r} in sys.modules",
            "print('RESULT ' + json.dumps(out))",
        ]
    )
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize("package", lazy_inits.DEFERRED)
def test_every_reexported_name_is_the_object_its_module_defines(package):
    """Fails when upstream moves a name out of the module its package imports it from."""
    module = importlib.import_module(package)
    source = Path(module.__file__).read_text(encoding="utf-8")
    names = lazy_inits.reexports(ast.parse(source), package)
    for name, (where, original) in names.items():
        assert getattr(importlib.import_module(where), original) is getattr(module, name), f"{package}.{name}"


def test_a_dry_run_process_builds_the_committed_configs_without_the_other_bridges():
    out = _in_a_dry_run_process(
        "\n".join(
            [
                "from tests.unit import test_recipe_configs as t",
                "out['same'] = t.fingerprints() == json.loads(t.FINGERPRINTS.read_text())",
                "from bridge_recipes.runner.cli import main",
                "out['rc'] = [main(['--recipe', r, '--dry-run']) for r in "
                "('qwen35_35b_a3b_sft_8gpu_h200_bf16_config', 'qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config')]",
            ]
        )
    )
    assert out["installed"] is True
    assert out["same"] is True
    assert out["rc"] == [0, 0]
    assert "megatron.bridge" in out["deferred"] and out["other_bridge"] is False


def test_autobridge_runs_every_deferred_body_first():
    out = _in_a_dry_run_process("from megatron.bridge import AutoBridge")
    assert out["installed"] is True
    assert out["deferred"] == [] and out["other_bridge"] is True


def test_install_stands_aside_where_it_cannot_defer(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setitem(sys.modules, "megatron.training", sys.modules.get("megatron.training", object()))
    assert lazy_inits.install() is False  # a deferred package is imported already
    monkeypatch.delitem(sys.modules, "megatron.training")
    for name in lazy_inits.DEFERRED:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setenv(lazy_inits.PLAIN_IMPORTS, "1")
    assert lazy_inits.install() is False  # asked for plain imports
    monkeypatch.delenv(lazy_inits.PLAIN_IMPORTS)
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "9.9.9")
    assert lazy_inits.install() is False  # versions it was not written for
    assert not any(isinstance(f, lazy_inits._Finder) for f in sys.meta_path)
