"""Measured status follows what runs: a policy edit turns the recipes it changes to "changed since measured"
in the README table, on the performance page and in ``--list``, and leaves the others measured."""

from __future__ import annotations

import json

import pytest

from bridge_recipes.config.builder import build
from bridge_recipes.config.fingerprint import recipe_fingerprint
from bridge_recipes.recipes import registry
from bridge_recipes.recipes.qwen import policy
from bridge_recipes.recipes.recipe import CHANGED_SINCE_MEASURED
from lab import report


def measured_names() -> list[str]:
    return sorted(n for n, e in registry.discover().items() if e.meta.status == "measured" and e.meta.measured)


def table_statuses(table: str) -> dict[str, str]:
    rows = [line.split("|") for line in table.splitlines()[2:]]
    return {cells[1].strip(" `"): cells[4].strip() for cells in rows}


def list_statuses(text: str) -> dict[str, str]:
    return {line.split()[0]: line for line in text.splitlines()[2:-1]}


@pytest.fixture
def unfused_router(monkeypatch) -> set[str]:
    """The policy block that fuses the MoE router made a no-op; returns the measured recipes it changes
    (those whose config fuses the router before the edit)."""
    fused = {n for n in measured_names() if build(n).model.moe_router_fusion}
    monkeypatch.setattr(policy, "fused_router", lambda cfg: None)
    return fused


def test_every_measured_recipe_is_measured_as_committed():
    status = report.recipe_statuses()
    assert measured_names() and all(status[n] == "measured" for n in measured_names())
    assert all(status[n] == e.meta.status for n, e in registry.discover().items())


def test_a_policy_edit_turns_the_recipes_it_changes_to_changed_since_measured(unfused_router, tmp_path, monkeypatch):
    assert unfused_router and set(measured_names()) - unfused_router  # some recipes changed, some not
    status = report.recipe_statuses()
    for name in measured_names():
        assert status[name] == (CHANGED_SINCE_MEASURED if name in unfused_router else "measured"), name
    # the README table (and the performance page, which holds the same table)
    table = table_statuses(report.recipe_table())
    for name in measured_names():
        assert table[name] == status[name]
    assert f"| {CHANGED_SINCE_MEASURED} |" in report.render()
    # --list reads what the report generates
    figures = tmp_path / "measured_figures.json"
    figures.write_text(report.measured_figures())
    monkeypatch.setattr(registry, "MEASURED_FIGURES", figures)
    registry._measured_figures.cache_clear()
    try:
        listed = list_statuses(registry.table(list(registry.discover().values())))
    finally:
        registry._measured_figures.cache_clear()
    for name in measured_names():
        assert (CHANGED_SINCE_MEASURED in listed[name]) == (name in unfused_router), listed[name]


def test_a_result_with_its_own_fingerprint_wins_over_the_adoption_record(monkeypatch, tmp_path):
    name = measured_names()[0]
    entry = registry.discover()[name]
    doc = report.read_result(report._file(entry.meta.measured["result"]))
    assert report.measured_fingerprint(entry) == recipe_fingerprint(name)
    # a new result of the recipe as it builds now covers it, whatever the adoption file says
    stale = {"recipe": "0" * 64, "rows": "0" * 64}
    monkeypatch.setattr(report, "read_result", lambda path: {**doc, "fingerprint": recipe_fingerprint(name)})
    adopted = tmp_path / "adopted.json"
    adopted.write_text(
        json.dumps({"recipes": {name: {"result": entry.meta.measured["result"], "fingerprint": stale}}})
    )
    monkeypatch.setattr(report, "ADOPTED", adopted)
    assert report.recipe_statuses()[name] == "measured"
    # a result of another config is not this recipe's measurement
    monkeypatch.setattr(report, "read_result", lambda path: {**doc, "fingerprint": stale})
    assert report.recipe_statuses()[name] == CHANGED_SINCE_MEASURED


def test_an_adoption_record_covers_only_the_result_it_names(monkeypatch, tmp_path):
    name = measured_names()[0]
    entry = registry.discover()[name]
    record = {"result": "evidence/another.yaml", "fingerprint": recipe_fingerprint(name)}
    adopted = tmp_path / "adopted.json"
    adopted.write_text(json.dumps({"recipes": {name: record}}))
    monkeypatch.setattr(report, "ADOPTED", adopted)
    assert report.measured_fingerprint(entry) is None  # a result without a fingerprint vouches for nothing
    assert report.recipe_statuses()[name] == CHANGED_SINCE_MEASURED
    record["result"] = entry.meta.measured["result"]
    adopted.write_text(json.dumps({"recipes": {name: record}}))
    assert report.recipe_statuses()[name] == "measured"


def test_the_adoption_record_is_in_the_evidence_manifest_with_the_statuses_it_backs():
    entries = {e["file"]: e for e in json.loads(report.manifest())}
    backs = entries[report._rel(report.ADOPTED)]["backs"]
    assert {f"status of {n}" for n in measured_names()} <= set(backs)
