"""Recipe discovery: by exported name, without importing Megatron; listing and suggestions."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.recipes import registry
from bridge_recipes.runner.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_list_imports_neither_torch_nor_megatron():
    code = (
        "import sys, io, contextlib; from bridge_recipes.runner.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf): rc = main(['--list'])\n"
        "import json; print(json.dumps({'rc': rc, 'heavy': sorted(m for m in ('torch', 'megatron', "
        "'transformer_engine') if m in sys.modules), 'rows': buf.getvalue().count('_config')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"rc": 0, "heavy": [], "rows": len(registry.entries())}


def test_list_table_has_the_columns_and_figures(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header == ["recipe", "tree", "task", "GPUs", "GPU", "prec", "layout", "status", "measured", "published"]
    row = next(line for line in out.splitlines() if line.startswith("qwen35_35b_a3b_sft_8gpu_h200_bf16_config "))
    assert re.search(r"\bTP1 PP1 EP8 DP8\b", row) and "4,663.1" in row, row


def test_filter_keeps_rows_matching_every_term(capsys):
    assert main(["--list", "--filter", "h200", "27b"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "_config" in line]
    assert rows and all("27b" in r and "h200" in r for r in rows)


def test_filter_lora_finds_the_peft_recipes(capsys):
    assert main(["--list", "--filter", "lora"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "_config" in line]
    peft = [e.name for e in registry.entries().values() if e.meta.task == "peft"]
    assert rows and sorted(rows) == sorted(peft)


def test_misspelt_name_exits_2_with_the_closest_names(capsys):
    assert main(["--recipe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_confg"]) == 2
    err = capsys.readouterr().err
    assert "no recipe named" in err and "qwen35_35b_a3b_sft_8gpu_h200_bf16_config" in err


def test_static_metadata_equals_the_runtime_decorator():
    for name, entry in registry.discover().items():
        fn = registry.load(name)
        assert fn.recipe_meta == entry.meta, name
        assert fn.__module__ == entry.module


def test_exported_names_are_exactly_the_decorated_recipes():
    import importlib

    modules = {e.module for e in registry.discover().values()}
    for mod in modules:
        m = importlib.import_module(mod)
        decorated = {n for n, e in registry.discover().items() if e.module == mod}
        assert set(m.__all__) == decorated, mod


def test_duplicate_recipe_names_are_rejected(tmp_path, monkeypatch):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "r.py").write_text(
            "from bridge_recipes.recipes.recipe import recipe\n"
            "@recipe(task='sft', gpus=8, gpu='h200', precision='bf16', layout='TP1')\n"
            "def same_config():\n    pass\n"
        )
    monkeypatch.setattr(registry, "TREES", {"bridge_recipes": tmp_path / "a", "perf_recipes": tmp_path / "b"})
    registry.discover.cache_clear()
    try:
        with pytest.raises(ValueError, match="defined twice"):
            registry.discover()
    finally:
        registry.discover.cache_clear()


def _twin_trees(tmp_path, monkeypatch, twin_decorator):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    (tmp_path / "a" / "r.py").write_text(
        "@recipe(task='sft', gpus=8, gpu='h200', precision='bf16', layout='TP1', status='functional',\n"
        "        evidence='run.log', reference={'tokens_per_s_per_gpu': 1.0, 'source': 's'})\n"
        "def real_config():\n    pass\n"
    )
    (tmp_path / "b" / "p.py").write_text(f"{twin_decorator}\ndef real_mock_config():\n    pass\n")
    monkeypatch.setattr(registry, "TREES", {"bridge_recipes": tmp_path / "a", "perf_recipes": tmp_path / "b"})
    registry.discover.cache_clear()


def test_a_benchmark_twin_takes_its_real_recipes_metadata_and_its_declared_differences(tmp_path, monkeypatch):
    _twin_trees(tmp_path, monkeypatch, "@benchmark_of(real.real_config, layout='TP2')")
    try:
        found = registry.discover()
    finally:
        registry.discover.cache_clear()
    real, twin = found["real_config"].meta, found["real_mock_config"].meta
    assert (twin.task, twin.gpus, twin.gpu, twin.precision, twin.reference) == (
        real.task,
        real.gpus,
        real.gpu,
        real.precision,
        real.reference,
    )
    assert (twin.layout, twin.twin_of) == ("TP2", "real_config")
    assert (twin.status, twin.evidence) == ("unmeasured", None) and real.status == "functional"


def test_a_benchmark_twin_of_an_unknown_recipe_is_reported_with_its_location(tmp_path, monkeypatch):
    _twin_trees(tmp_path, monkeypatch, "@benchmark_of(real.no_such_config)")
    try:
        with pytest.raises(ValueError, match=r"p.py:2: @benchmark_of of real_mock_config .*no_such_config"):
            registry.discover()
    finally:
        registry.discover.cache_clear()


def test_non_literal_metadata_is_reported_with_its_location(tmp_path):
    path = tmp_path / "r.py"
    path.write_text(
        "@recipe(task=make_task(), gpus=1, gpu='h200', precision='bf16', layout='x')\ndef x_config(): pass\n"
    )
    with pytest.raises(ValueError, match=r"r.py:2: @recipe arguments of x_config must be literals"):
        registry.scan_file("bridge_recipes", tmp_path, path)


def test_qwen36_aliases_resolve_to_the_one_definition_with_the_qwen36_checkpoint():
    from bridge_recipes.models.qwen35 import SPECS

    aliases = registry.aliases()
    assert (
        "qwen36_35b_a3b_sft_8gpu_h200_bf16_config" in aliases
        and "qwen36_vl_35b_a3b_sft_8gpu_h200_bf16_config" in aliases
    )
    for name, entry in aliases.items():
        base = registry.find(entry.alias_of)
        prefix = registry.ALIAS_FAMILIES[entry.family]
        assert name == prefix + base.name.removeprefix("qwen35_") and base.alias_of is None
        assert (entry.meta, entry.module, entry.tree) == (base.meta, base.module, base.tree)
        assert entry.checkpoint == SPECS[base.model].checkpoints[entry.family]
        release = registry.release_name(entry.family)
        assert base.checkpoint.hf_id.startswith("Qwen/Qwen3.5-") and entry.checkpoint.hf_id.startswith(
            f"Qwen/{release}-"
        )
    # sizes without a Qwen3.6 checkpoint in the catalog get no alias
    assert not any(n.startswith(("qwen36_122b", "qwen36_397b", "qwen36_vl_397b")) for n in aliases)
    assert not set(aliases) & set(registry.discover())


def test_a_config_built_through_an_alias_records_the_qwen36_checkpoint():
    text = registry.load("qwen36_35b_a3b_sft_8gpu_h200_bf16_config")()
    assert text.model.hf_model_id == "Qwen/Qwen3.6-35B-A3B"
    assert registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")().model.hf_model_id is None
    vl = registry.load("qwen36_vl_35b_a3b_sft_8gpu_h200_bf16_mock_config")()
    assert vl.dataset.hf_processor_path == "Qwen/Qwen3.6-35B-A3B" == vl.model.hf_model_id


def test_list_filter_qwen36_shows_the_aliases_and_dry_run_takes_one(capsys):
    assert main(["--list", "--filter", "qwen36"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "_config" in line]
    assert sorted(rows) == sorted(n for n in registry.aliases() if n.startswith("qwen36_"))
    name = "qwen36_35b_a3b_sft_8gpu_h200_bf16_config"
    assert main(["--recipe", name, "--dry-run", "--world-size", "8", "--show-yaml"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^# model: Qwen/Qwen3\.6-35B-A3B\b.*revision 995ad96e", out, re.M), out[:2000]
    assert "hf_model_id: Qwen/Qwen3.6-35B-A3B" in out


def test_the_listing_shows_each_measured_recipes_figure(monkeypatch, tmp_path):
    """--list's measured column: the generated figure of a measured recipe (its Qwen3.6 alias too), '-' for
    the others and when the figures file is missing."""
    entries = registry.entries()
    measured = next(n for n, e in entries.items() if e.meta.status == "measured" and e.alias_of is None)
    alias = next(n for n, e in entries.items() if e.alias_of == measured)
    other = next(n for n, e in entries.items() if e.meta.status != "measured")
    figures = tmp_path / "measured_figures.json"
    record = {
        "tokens_per_s_per_gpu": 1234.5,
        "gpu": "H100 80GB HBM3",
        "gpu_type": "H100",
        "memory_cap_gb": 47.68,
        "date": "2026-12-05",
        "tokens_per_micro_batch": 8192,
    }
    figures.write_text(json.dumps({measured: record}))
    monkeypatch.setattr(registry, "MEASURED_FIGURES", figures)
    registry._measured_figures.cache_clear()
    rows = {
        line.split()[0]: line.split()
        for line in registry.table([entries[n] for n in (measured, alias, other)]).splitlines()
    }
    assert "1,234.5" in rows[measured] and "1,234.5" in rows[alias]
    assert "1,234.5" not in rows[other]
    # where it was measured: the GPU as the result records it, the cap and the day
    assert {"H100", "80GB", "HBM3,", "47.7", "2026-12-05"} <= set(rows[measured]), rows[measured]
    assert registry.measured_rate(measured) == 1234.5 and registry.measured_rate(other) is None
    assert registry.measured_rate(alias) == 1234.5
    figures.unlink()
    registry._measured_figures.cache_clear()
    assert "1,234.5" not in registry.table([entries[measured]])
    registry._measured_figures.cache_clear()
