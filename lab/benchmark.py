"""The lab's benchmark command: the product's (``scripts/benchmark.py``) plus candidate policies and
full-scale predictions.

    python -m lab.benchmark --candidate NAME [--proxy-layers 4] --out FILE [benchmark options]
    python -m lab.benchmark --predict RECIPE --proxy-results A.yaml B.yaml [--intercept-result C.yaml]

``--candidate`` runs a candidate (:mod:`lab.candidates`) and its published policy side by side, in
one command; ``--predict`` estimates a recipe's full-scale tokens/s per GPU from two proxy depths
(:mod:`lab.predict`). Everything else is the product's benchmark.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bridge_recipes.bench import benchmark as product
from bridge_recipes.bench.harness import build_config
from bridge_recipes.config.overrides import in_cli_terms
from bridge_recipes.recipes import registry
from bridge_recipes.utils.outputs import write_text_atomic


def build_parser() -> argparse.ArgumentParser:
    ap = product.build_parser()
    ap.prog = "python -m lab.benchmark"
    ap.add_argument(
        "--candidate",
        help="a candidate policy (lab.candidates) measured side by side with its published policy; with --rows, "
        "the recipe itself runs instead of its mock form (a loss-curve check on chat rows)",
    )
    ap.add_argument("--predict", metavar="RECIPE", help="predict RECIPE's full-scale tokens/s/GPU from two proxies")
    ap.add_argument("--proxy-results", nargs=2, metavar=("A.yaml", "B.yaml"), help="with --predict: two depths")
    ep_comm = ap.add_mutually_exclusive_group()
    ep_comm.add_argument(
        "--ep-comm-s", type=float, help="with --predict: EP all-to-all seconds per layer per micro batch (two GPUs)"
    )
    ep_comm.add_argument(
        "--ep-comm-trace",
        metavar="two_gpu_qwen35_35b_a3b.json",
        help="with --predict: --ep-comm-s from the two-GPU suite's traced EP2 step (an upper bound)",
    )
    ap.add_argument(
        "--intercept-result",
        metavar="C.yaml",
        help="with --predict: a proxy at the recipe's real output layer and MTP when the slope proxies shrank them",
    )
    ap.add_argument(
        "--without-mtp",
        action="store_true",
        help="with --predict and --intercept-result: the recipe as run without its MTP layer (as the published 27B)",
    )
    return ap


def runs_of(opts) -> list[tuple[str, str, list[str]]]:
    """(label, recipe, own overrides) of each run: a --candidate and its published policy (the same
    recipe without the candidate's overrides), or the product's --recipe and --against."""
    if not getattr(opts, "candidate", None):
        return product.runs_of(opts)
    from lab.candidates import find

    c = find(opts.candidate)
    if opts.recipe or opts.against or opts.against_set:
        raise ValueError("--candidate names both runs; drop --recipe, --against and --against-set")
    if opts.proxy_layers and c.full_scale_only:
        raise ValueError(
            f"--candidate {c.name} changes the pipeline split, which no proxy has: run it at the recipe's own "
            "scale (drop --proxy-layers)"
        )
    if opts.proxy_layers and opts.proxy_gpus != c.proxy_gpus:
        raise ValueError(
            f"--candidate {c.name} is measured on {c.proxy_gpus} GPU(s): pass --proxy-gpus {c.proxy_gpus}"
        )
    # on chat rows (--rows) both run the recipe itself, whose data the rows replace; else its mock form
    recipe = c.recipe if opts.rows else c.mock_recipe
    return [
        (c.name, recipe, c.proxy_overrides(opts.proxy_layers)),
        ("published", recipe, list(c.published_overrides)),
    ]


def predict_main(opts, ap: argparse.ArgumentParser) -> int:
    """--predict RECIPE --proxy-results A B: the full-scale prediction, printed (and written to --out)."""
    from bridge_recipes.utils.outputs import output_problem
    from lab import predict as pr

    if not opts.proxy_results:
        ap.error("--predict needs --proxy-results A.yaml B.yaml (scripts/benchmark.py --proxy-layers at two depths)")
    inputs = [
        *(("--proxy-results", p) for p in opts.proxy_results),
        ("--intercept-result", opts.intercept_result),
        ("--ep-comm-trace", opts.ep_comm_trace),
    ]
    if opts.out and (problem := output_problem(opts.out, option="--out", inputs=[i for i in inputs if i[1]])):
        ap.error(problem)
    if opts.ep_comm_s is not None and not (math.isfinite(opts.ep_comm_s) and opts.ep_comm_s >= 0):
        ap.error(f"--ep-comm-s {opts.ep_comm_s}: a number of seconds >= 0")
    try:
        entry = registry.find(opts.predict)
        points = [pr.proxy_point(p) for p in opts.proxy_results]
        cfg = build_config(entry.name, overrides=opts.overrides)
        published = (entry.meta.reference or {}).get("tokens_per_s_per_gpu")
        intercept = pr.proxy_point(opts.intercept_result) if opts.intercept_result else None
        ep_comm_s = opts.ep_comm_s
        if opts.ep_comm_trace:
            ep_comm_s = pr.two_gpu_ep_comm_s(opts.ep_comm_trace, cfg.model.expert_model_parallel_size)
            ms = ep_comm_s * 1e3
            print(f"[predict] EP all-to-all from {opts.ep_comm_trace}: {ms:.2f} ms per layer per micro batch")
        prediction = pr.predict(
            cfg,
            entry.meta.gpus,
            points,
            recipe=entry.name,
            ep_comm_s=ep_comm_s,
            published=published,
            intercept=intercept,
            without_mtp=opts.without_mtp,
        )
    except (registry.UnknownRecipe, ValueError) as exc:
        ap.error(in_cli_terms(str(exc)))
    print(pr.report(prediction))
    if opts.out:
        write_text_atomic(Path(opts.out), json.dumps(prediction.as_dict(), indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    opts = ap.parse_intermixed_args(argv)
    if opts.predict:
        return predict_main(opts, ap)
    return product.run_parsed(opts, ap, runs=runs_of)


if __name__ == "__main__":
    from bridge_recipes.utils import quiet

    quiet.install()
    raise SystemExit(main())
