"""docs/performance.md and the README's recipe table are what the committed results give."""

from __future__ import annotations

import json

import pytest

from bridge_recipes.recipes import registry
from lab import report, resolve


def test_performance_page_and_readme_table_are_current(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().err


def test_readme_table_is_replaced_between_its_markers_only():
    text = f"intro\n{report.TABLE_BEGIN}\nold row\n{report.TABLE_END}\nafter\n"
    out = report.readme_with_table(text, "| new |\n")
    assert out == f"intro\n{report.TABLE_BEGIN}\n| new |\n{report.TABLE_END}\nafter\n"
    assert report.readme_with_table(out, "| new |\n") == out


def test_readme_without_markers_is_an_error():
    with pytest.raises(ValueError, match="markers"):
        report.readme_with_table("no table here\n", "| x |\n")


def test_a_stale_page_is_reported_and_rewritten(tmp_path, monkeypatch, capsys):
    page, readme = tmp_path / "performance.md", tmp_path / "README.md"
    page.write_text("old\n")
    readme.write_text(f"# x\n{report.TABLE_BEGIN}\n{report.TABLE_END}\n")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setattr(report, "PAGE", page)
    monkeypatch.setattr(report, "README", readme)
    monkeypatch.setattr(report, "MANIFEST", tmp_path / "MANIFEST.json")
    monkeypatch.setattr(report, "manifest", lambda: "[]\n")
    monkeypatch.setattr(report.registry, "MEASURED_FIGURES", tmp_path / "measured_figures.json")
    monkeypatch.setattr(report, "measured_figures", lambda: "{}\n")
    monkeypatch.setattr(report, "render", lambda: "new\n")
    monkeypatch.setattr(report, "recipe_table", lambda: "| row |\n")
    assert report.main(["--check"]) == 1
    assert "performance.md is stale" in capsys.readouterr().err and page.read_text() == "old\n"
    assert report.main([]) == 0 and page.read_text() == "new\n" and "| row |" in readme.read_text()
    assert report.main(["--check"]) == 0


def test_every_real_data_recipe_has_a_row_with_its_layout_and_status():
    rows = {line.split("|")[1].strip(" `"): line for line in report.recipe_table().splitlines()[2:]}
    real = {n: e for n, e in registry.discover().items() if e.tree == "bridge_recipes"}
    assert set(rows) == set(real)
    status = report.recipe_statuses()
    for name, entry in real.items():
        cells = [c.strip() for c in rows[name].split("|")[1:-1]]
        assert cells[2] == entry.meta.layout and cells[3] == status[name]


def test_manifest_lists_every_evidence_file_with_its_hash_and_what_it_backs():
    import hashlib

    entries = {e["file"]: e for e in json.loads(report.manifest())}
    tracked = {report._rel(p) for p in report._tracked(report.EVIDENCE, report.RESULTS)} - {
        "lab/evidence/MANIFEST.json"
    }
    assert set(entries) == tracked
    for rel, e in entries.items():
        assert e["sha256"] == hashlib.sha256((report.ROOT / rel).read_bytes()).hexdigest()
    for name, entry in registry.discover().items():
        if entry.meta.status == "functional":
            assert f"status of {name}" in entries[report._rel(resolve(entry.meta.evidence))]["backs"]


def test_a_candidate_log_as_evidence_reads_its_ratio_file(tmp_path, monkeypatch):
    (tmp_path / "candidates").mkdir()
    (tmp_path / "candidates" / "c1_ratio.json").write_text(json.dumps({"tokens_per_s_ratio": 1.234}))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "ROOT", tmp_path.parent)
    entry = registry.discover()["qwen35_35b_a3b_sft_8gpu_h200_bf16_config"]
    meta = entry.meta.__class__(**{**entry.meta.__dict__, "evidence": "evidence/candidates/c1.log"})
    figure, source = report.recipe_figure(entry.__class__(**{**entry.__dict__, "meta": meta}))
    assert figure.startswith("1.23x") and source.endswith("candidates/c1_ratio.json")


def test_result_files_of_another_shape_are_left_out_of_the_tables(tmp_path, monkeypatch):
    (tmp_path / "packing_ratio.json").write_text(json.dumps({"ratio": 1.5}))
    (tmp_path / "a_ratio.json").write_text(
        json.dumps(
            {"candidate": "c", "reference": "r", "tokens_per_s_ratio": 1.25, "loss_curves": {"compared": False}}
        )
    )
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    rows = report.proxy_table().splitlines()[2:]
    assert len(rows) == 1 and "`a_ratio.json`" in rows[0] and "1.250" in rows[0] and "not compared" in rows[0]


def test_packed_sft_convergence_files_are_shown_when_present(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "EVIDENCE", tmp_path)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    assert report.convergence_table() == ""  # no file: no section text
    (tmp_path / "packing").mkdir()
    losses = {str(s): 1.0 / s for s in range(1, 11)}
    doc = {
        "family": "qwen35_27b",
        "measured": "2026-01-02",
        "gpu": "NVIDIA H200",
        "boundaries": {"losses": losses, "validation_losses": {"10": 2.5, "5": 3.25}},
        "one_per_row": {"losses": losses, "validation_losses": {"5": 3.5, "10": 2.625}},
        "comparison": {"correlation": 0.99876, "final_loss_difference": 0.0123, "passed": True},
    }
    (tmp_path / "packing" / "packed_sft_convergence_qwen35_27b.json").write_text(json.dumps(doc))
    (row,) = [line for line in report.convergence_table().splitlines() if "packed_sft_convergence_qwen35_27b" in line]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:6] == ["qwen35_27b", "10", "0.9988", "1.23%", "3.2500 (step 5), 2.5000 (step 10)"]
    assert cells[6:8] == ["3.5000 (step 5), 2.6250 (step 10)", "yes"]
    assert cells[8] == "-"  # no joined micro-batch run in this file
    doc["micro_batch"] = {"comparison": {"correlation": 0.999, "final_loss_difference": 0.004, "passed": False}}
    (tmp_path / "packing" / "packed_sft_convergence_qwen35_27b.json").write_text(json.dumps(doc))
    (row,) = [line for line in report.convergence_table().splitlines() if "packed_sft_convergence_qwen35_27b" in line]
    assert [c.strip() for c in row.strip("|").split("|")][8] == "FAILED, 0.40%"
    doc["micro_batch"]["same_initial_weights"] = False  # a run that started from other weights says so
    (tmp_path / "packing" / "packed_sft_convergence_qwen35_27b.json").write_text(json.dumps(doc))
    (row,) = [line for line in report.convergence_table().splitlines() if "packed_sft_convergence_qwen35_27b" in line]
    assert [c.strip() for c in row.strip("|").split("|")][8] == "FAILED, 0.40% (other initial weights)"


def test_a_reference_run_with_its_own_overrides_says_so_and_two_policies_are_not_a_packing_row(tmp_path, monkeypatch):
    ratio = {
        "candidate": "r",
        "reference": "r",
        "tokens_per_s_ratio": 0.7,
        "loss_curves": {"compared": False},
        "packing": "boundaries",
        "baseline_packing": "boundaries",
        "useful_tokens_per_s_ratio": 0.7,
        "reference_overrides": ["+env_vars.X=1", "logger.tensorboard_dir=/tmp/tb", "profiling.profile_ranks=[0]"],
    }
    (tmp_path / "a_ratio.json").write_text(json.dumps(ratio))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    (row,) = report.proxy_table().splitlines()[2:]
    assert "`r` with `+env_vars.X=1` |" in row and "tensorboard" not in row and "profil" not in row
    assert report.packing_table().splitlines()[2:] == []  # the same data path on both sides
    ratio["baseline_packing"] = "one_per_row"
    (tmp_path / "a_ratio.json").write_text(json.dumps(ratio))
    assert len(report.packing_table().splitlines()[2:]) == 1


def test_a_comparison_line_names_the_recipes_newer_measurement(tmp_path, monkeypatch):
    from types import SimpleNamespace

    recipe = "qwen35_35b_a3b_peft_1gpu_h200_bf16_config"
    line = {"recipe": recipe, "window": [5, 19], "ours_tokens_per_s": 2.0, "peer_tokens_per_s": 1.0}
    (tmp_path / "single_gpu_lora_vs_peft.json").write_text(json.dumps([line]))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "EVIDENCE", tmp_path / "lab" / "evidence")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    measured = {"result": f"evidence/lora_vs_peft/{recipe}.yaml"}
    entry = SimpleNamespace(meta=SimpleNamespace(measured=measured))
    monkeypatch.setattr(report.registry, "find", lambda name: entry)
    (row,) = [r for r in report.lora_vs_peft_table().splitlines() if recipe in r]
    assert "as it is now" not in row  # the line is the recipe's own measurement
    assert row.split(" | ")[2] == "-"  # no rows per step recorded
    line["global_batch"] = 4
    (tmp_path / "single_gpu_lora_vs_peft.json").write_text(json.dumps([line]))
    (row,) = [r for r in report.lora_vs_peft_table().splitlines() if recipe in r]
    assert row.split(" | ")[2:4] == ["4", "2.0"]
    measured["result"] = "results/newer.yaml"
    (row,) = [r for r in report.lora_vs_peft_table().splitlines() if recipe in r]
    assert "the recipe as it is now: `lab/results/newer.yaml`" in row


def test_the_trace_table_names_the_host_operators_with_the_most_time_of_their_own(tmp_path, monkeypatch):
    trace = {"window_ms": 10.0, "busy_ms": 2.0, "idle_ms": 8.0, "kernels_per_step": 5}
    (tmp_path / "h200_trace_old.json").write_text(json.dumps(trace))  # a summary from before host figures
    top = {"a": {"self_ms": 1.0}, "b": {"self_ms": 30.0}, "c": {"self_ms": 2.0}, "d": {"self_ms": 0.5}}
    trace["host"] = {"launch_ms": 4.0, "work": {"cpu_op": {"top": top}}}
    (tmp_path / "h200_trace_new.json").write_text(json.dumps(trace))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    new, old = report.trace_table().splitlines()[2:]
    assert new.endswith("| 4.0 | b 30, c 2, a 1 |") and old.endswith("| - | - |")
