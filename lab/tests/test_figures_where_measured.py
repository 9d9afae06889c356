"""Each measured recipe's figure is its result file's, with the GPU that run used as the result records it,
the memory cap it ran under (when smaller than that GPU's own memory) and the day."""

from __future__ import annotations

import pytest

from bridge_recipes.bench.result import CAP_NOTE
from bridge_recipes.hardware.gpus import GPUS
from bridge_recipes.recipes import registry
from lab import report


def measured_names() -> list[str]:
    return sorted(n for n, e in registry.discover().items() if e.meta.status == "measured" and e.meta.measured)


@pytest.mark.parametrize("name", measured_names())
def test_each_figure_is_its_result_files_with_the_gpu_the_run_used(name):
    doc = report.read_result(report._file(registry.discover()[name].meta.measured["result"]))
    m = registry.measured(name)
    assert m is not None
    assert m.tokens_per_s_per_gpu == doc["result"]["tokens_per_s_per_gpu"]
    assert f"NVIDIA {m.gpu}" == doc["stack"]["gpu_name"] and m.gpu_type == doc["gpu"]["type"]
    assert m.date == str(doc["result"]["measured"])
    assert m.tokens_per_micro_batch == doc["layout"]["max_tokens_per_gpu"] * doc["layout"]["cp"]
    caps = [float(n.split(" at ")[1].split()[0]) for n in doc.get("notes") or [] if "--gpu-memory-gb" in n]
    smaller = [c for c in caps if round(c, 1) < round(GPUS[m.gpu_type].usable_memory_gb, 1)]
    assert m.memory_cap_gb == (round(smaller[0], 2) if smaller else None)
    assert m.gpu in m.where and m.date in m.where and ("capped at" in m.where) == bool(smaller)


def test_a_cap_below_the_gpus_memory_is_named_and_one_at_it_is_not(monkeypatch):
    entry = registry.discover()["qwen35_35b_a3b_peft_1gpu_h100_bf16_config"]
    doc = report.read_result(report._file(entry.meta.measured["result"]))
    for cap, named in ((47.6849, 47.68), (85.0081, None)):
        changed = {**doc, "notes": [f"{CAP_NOTE} {cap} GB"]}
        monkeypatch.setattr(report, "read_result", lambda path, d=changed: d)
        assert report.measured_record(entry)["memory_cap_gb"] == named
