"""The two-GPU evidence plan (bridge_recipes.bench.evidence.TWO_GPU_*): every queued layout is
a valid layout on its GPUs, changes only the parallel layout, and trains the same model on the
same rows as the one-GPU reference, so their loss curves are comparable."""

import pytest

import bridge_recipes
from bridge_recipes.bench.evidence import (
    GPU_FAMILIES,
    TWO_GPU_FAMILY_LAYOUTS,
    TWO_GPU_RESUMES,
    two_gpu_request,
    two_gpu_world,
)
from bridge_recipes.bench.harness import different_training
from bridge_recipes.layout import layout_of
from bridge_recipes.runner import checks

CASES = [(family, layout) for family, layouts in TWO_GPU_FAMILY_LAYOUTS.items() for layout in layouts]


def _build(family, layout):
    return bridge_recipes.build(GPU_FAMILIES[family]["recipe"], **two_gpu_request(family, layout))


@pytest.mark.parametrize("family,layout", CASES, ids=[f"{f}-{x}" for f, x in CASES])
def test_layout_is_valid_on_two_gpus_and_trains_the_reference_model(family, layout):
    cfg, ref = _build(family, layout), _build(family, None)
    assert checks.errors(checks.check(cfg, 2)) == []
    assert different_training(cfg, ref) is None
    assert layout_of(cfg, 2) != layout_of(ref, 2)


def test_every_dimension_the_recipes_use_is_covered():
    covered = {x for layouts in TWO_GPU_FAMILY_LAYOUTS.values() for x in layouts}
    assert {"ep2", "pp2", "pp2_uneven", "tp2_sp", "cp2", "etp2", "vpp2"} <= covered


@pytest.mark.parametrize("saved,resumed", TWO_GPU_RESUMES)
def test_resume_pairs_are_valid_at_both_ends(saved, resumed):
    for layout in (saved, resumed):
        cfg = _build("qwen35_35b_a3b", layout)
        assert checks.errors(checks.check(cfg, two_gpu_world(layout))) == []


def test_committed_predictions_are_the_planners_and_every_run_fits():
    from pathlib import Path

    from bridge_recipes.bench.evidence import two_gpu_predictions

    text = two_gpu_predictions()
    committed = Path(__file__).resolve().parents[2] / "docs/evidence/two_gpu_predictions.md"
    assert committed.read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| qwen35")]
    assert len(rows) == len(CASES) + len(TWO_GPU_FAMILY_LAYOUTS)
    assert all("| yes (" in row for row in rows), [r for r in rows if "| yes (" not in r]
