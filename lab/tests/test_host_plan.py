"""The one-GPU LoRA host-time plan points at what it is built on: operators of its traced step, the
recipe's measured result, and queue lines that measure what is queued."""

from __future__ import annotations

import json

from bridge_recipes.recipes import registry
from lab import ROOT

PLAN = ROOT / "lab/results/lora_host_plan.json"
QUEUE = ROOT / "lab/gpu/queues/h200_1gpu.txt"
STATUSES = {"queued", "planned", "blocked", "measured"}


def _plan() -> dict:
    return json.loads(PLAN.read_text())


def _queued_outputs() -> str:
    return "\n".join(line for line in QUEUE.read_text().splitlines() if line.strip() and not line.startswith("#"))


def test_every_change_names_operators_of_its_traced_step():
    plan = _plan()
    top = json.loads((ROOT / plan["trace"]).read_text())["host"]["work"]["cpu_op"]["top"]
    for change in plan["changes"]:
        missing = [op for op in change["host_ops"] if op not in top]
        assert change["host_ops"] and not missing, (change["change"], missing)


def test_the_baseline_is_the_recipes_measured_result():
    plan = _plan()
    measured = registry.find(plan["recipe"]).meta.measured or {}
    assert (ROOT / "lab" / measured["result"]).resolve() == (ROOT / plan["baseline"]).resolve()


def test_what_is_queued_is_in_the_queue_and_the_rest_says_what_stops_it():
    plan, queued = _plan(), _queued_outputs()
    for change in plan["changes"]:
        assert change["status"] in STATUSES, change
        ratio = change.get("predicted_ratio")
        assert ratio is None or ratio > 1, change
        if change["status"] == "queued":
            assert f"$OUT/{change['queue']}" in queued, change["queue"]
        elif change["status"] != "measured":
            assert change.get("blocker"), change["change"]
    for trace in plan["traces_to_take"]:
        assert f"$OUT/{trace['queue']}" in queued and trace["recipe"] in queued, trace


def test_a_pair_at_fewer_layers_is_a_ratio_file_of_the_change():
    """A change measured at fewer layers names a benchmark ratio whose reference arm carries the change
    and whose loss curves agree, at the layer count and GPU the plan says."""
    from bridge_recipes.bench.result import read_result

    proxied = [c for c in _plan()["changes"] if c.get("proxy")]
    assert proxied
    for change in proxied:
        path = ROOT / change["proxy"]["ratio"]
        ratio = json.loads(path.read_text())
        assert ratio["proxy"] and ratio["loss_curves"]["passed"], path
        assert ratio["reference_overrides"], path  # the reference is the recipe with the change
        arm = read_result(path.with_name(path.name.replace("_ratio.json", "_against.yaml")))
        assert arm["gpu"]["type"] == change["proxy"]["gpu"], path
        assert f"--scale-down {change['proxy']['layers']} " in arm["command"], path
