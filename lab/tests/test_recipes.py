"""Every recipe's evidence id names a committed file that backs its status."""

import json

import pytest

from bridge_recipes.recipes import registry
from lab import names, resolve

RECIPES = sorted(registry.discover())


@pytest.mark.parametrize("name", RECIPES)
def test_evidence_files_exist(name):
    meta = registry.find(name).meta
    if meta.status == "functional":
        assert resolve(meta.evidence).is_file()
        if meta.evidence.endswith(".json"):  # an evidence result: it is this recipe's, and it passed
            doc = json.loads(resolve(meta.evidence).read_text())
            assert doc["recipe"] == name and doc["passed"] is True
    if meta.status == "measured":  # a benchmark result of this recipe, at its own GPU count and type
        from bridge_recipes.bench.result import memory_cap_gb, read_result
        from bridge_recipes.hardware.gpus import class_memory_gb

        doc = read_result(resolve(meta.measured["result"]))
        assert names.current(doc["recipe"], doc["result"]["measured"]) == name
        assert doc["result"]["tokens_per_s_per_gpu"] > 0
        assert doc["gpu"]["count"] == meta.gpus
        if doc["gpu"]["type"].lower() != meta.gpu:  # another GPU, its allocator capped at this one's memory
            assert memory_cap_gb(doc) == pytest.approx(class_memory_gb(meta.gpu), abs=0.5)


def test_a_name_reads_as_it_was_called_on_the_day_measured():
    renamed = {old: new for old, new in names.EARLIER_NAMES.items() if old != new}
    assert renamed and all(new in registry.discover() for new in renamed.values())
    old, new = next(iter(renamed.items()))
    import datetime

    before = (datetime.date.fromisoformat(names.RENAMED_ON) - datetime.timedelta(days=1)).isoformat()
    assert names.current(old, before) == new
    assert names.current(old, names.RENAMED_ON) == old  # measured after the rename: its own name
