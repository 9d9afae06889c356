"""Every recipe ``--list`` shows dry-runs as a user runs it: at its own GPU count, a LoRA recipe with the
switches the benchmark passes (random base weights, nothing saved), exit status 0 and no traceback.

An import-order failure shows only in a process's first build, so each recipe module gets a fresh
process, started the way ``scripts/run_recipe.py`` starts; its first recipe dry-runs on the import path
a user gets, and the module's other recipes follow in the same process through the runner's ``main``
(a dry run once Megatron is imported takes a fraction of a second). The processes run side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bridge_recipes.bench.harness import BENCHMARK_OVERRIDES
from bridge_recipes.features import random_lora
from bridge_recipes.recipes import registry

ROOT = Path(__file__).resolve().parents[2]
RESULT = "DRY_RUNS "

# One process per recipe module: the runner's start (what scripts/run_recipe.py imports, then its
# notices filter), then each command line in turn, its exit status and everything it printed.
CHILD = "\n".join(
    [
        "import contextlib, io, json, sys, traceback",
        "from bridge_recipes.runner.__main__ import START_STATE",
        "from bridge_recipes.utils import quiet",
        "from bridge_recipes.runner.cli import main",
        "quiet.install()",
        "results = []",
        "for argv in json.loads(sys.argv[1]):",
        "    out = io.StringIO()",
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):",
        "        try:",
        "            rc = main(argv, start_state=START_STATE)",
        "        except SystemExit as exc:",
        "            rc = exc.code",
        "        except BaseException:",
        "            traceback.print_exc()",
        "            rc = 'raised'",
        "    results.append({'argv': argv, 'rc': rc, 'output': out.getvalue()})",
        f"print({RESULT!r} + json.dumps(results))",
    ]
)


def user_argv(entry: registry.RecipeEntry) -> list[str]:
    """The dry run a user types for ``entry``: a LoRA recipe without base weights as the benchmark runs it."""
    argv = ["--recipe", entry.name, "--dry-run"]
    if entry.meta.task == "peft":
        argv += [random_lora.OPTION, *BENCHMARK_OVERRIDES]
    return argv


def listed() -> list[registry.RecipeEntry]:
    """The recipes ``--list`` shows, in its order."""
    return sorted(registry.entries().values(), key=lambda e: (e.tree, e.name))


def by_module() -> dict[str, list[registry.RecipeEntry]]:
    modules: dict[str, list[registry.RecipeEntry]] = defaultdict(list)
    for entry in listed():
        modules[entry.module].append(entry)
    return dict(modules)


def _dry_run_module(entries: list[registry.RecipeEntry]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "BRIDGE_RECIPES_VERBOSE")}
    env["PYTHONPATH"] = str(ROOT)
    argvs = [user_argv(e) for e in entries]
    p = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argvs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    lines = [line for line in p.stdout.splitlines() if line.startswith(RESULT)]
    results = json.loads(lines[-1][len(RESULT) :]) if lines else []
    return {"returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr, "results": results}


@pytest.fixture(scope="module")
def dry_runs() -> dict[str, dict]:
    """Module -> its process's exit status, output and each recipe's dry run; the processes side by side."""
    modules = by_module()
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 1))) as pool:
        done = dict(zip(modules, pool.map(_dry_run_module, modules.values()), strict=True))
    return done


@pytest.mark.parametrize("module", sorted(by_module()))
def test_each_recipe_of_the_module_dry_runs_in_a_fresh_process(dry_runs, module):
    got = dry_runs[module]
    assert got["returncode"] == 0 and got["results"], got["stderr"][-4000:]
    assert "Traceback" not in got["stdout"] + got["stderr"], got["stderr"][-4000:]
    names = [e.name for e in by_module()[module]]
    assert [r["argv"][1] for r in got["results"]] == names
    failed = {r["argv"][1]: r["output"][-3000:] for r in got["results"] if r["rc"] != 0 or "Traceback" in r["output"]}
    assert failed == {}


def test_the_dry_runs_cover_every_listed_name(capsys):
    """The names dry-run above are the names ``--list`` prints: the Qwen3.6 aliases, the GB300 MXFP8 VL
    recipes and the LoRA recipes among them."""
    from bridge_recipes.runner.cli import main

    assert main(["--list"]) == 0
    printed = {line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("qwen")}
    covered = {e.name for entries in by_module().values() for e in entries}
    assert printed == covered
    assert any(e.alias_of for e in listed()) and any(e.meta.task == "peft" for e in listed())
    fp8mx = {n for n in covered if "gb300_fp8mx" in n}
    assert len(fp8mx) == 4 and {n[:6] for n in fp8mx} == {"qwen35", "qwen36"}


def test_a_lora_recipe_is_dry_run_with_the_benchmark_switches():
    [lora] = [e for e in listed() if e.name == "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"]
    argv = user_argv(lora)
    assert random_lora.OPTION in argv and "checkpoint.save=null" in argv
    [sft] = [e for e in listed() if e.name == "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"]
    assert user_argv(sft) == ["--recipe", sft.name, "--dry-run"]  # its own GPU count: no --world-size
