"""Full-scale tokens/s/GPU of a recipe, predicted from one-GPU proxies of two depths.

    python -m lab.benchmark --predict RECIPE --proxy-results A.yaml B.yaml [--intercept-result C.yaml]
        [--ep-comm-s S]

The model, per GPU and per micro batch of the recipe's shard (its experts per GPU, its recompute
fraction; what ``--proxy-layers`` builds):

- two proxy result files of the same recipe at depths d1 < d2 (``benchmark.py --proxy-layers d``)
  give the time per micro batch, t(d) = step time / micro batches per step; the slope
  s = (t(d2) - t(d1)) / (d2 - d1) is one layer's cost and the intercept c = t(d1) - s d1 the fixed
  cost (embedding, output layer and loss, MTP; the optimizer step, amortized over the proxy's
  micro batches, is counted here too);
- the proxies recompute the recipe's share of their layers; a stage that recomputes another share
  f of its layers (block recompute of a fixed count over stages of different depths) takes
  s x (1 + rho f) / (1 + rho f_proxy) per layer, rho = 1/3 (a recomputed layer repeats its forward, a
  third of its training FLOPs; the 35B-A3B's measured recompute pair gives more, so for a MoE layer
  this is a floor);
- a pipeline stage's micro batch takes s x its layers, the last stage adds c, and the step takes
  (m + (PP - 1) / VPP) x the slowest stage (1F1B with its warm-up and cool-down bubble), with m
  micro batches per step per pipeline (global batch / (micro batch x DP));
- expert-parallel all-to-all is not in a one-GPU proxy: ``ep_comm_s`` (seconds per layer per
  micro batch, measured on two GPUs) is added per layer when the recipe's EP is above 1; without it the
  prediction is a bound (no EP communication) and says so;
- TP and CP split each layer over GPUs with communication a one-GPU proxy cannot see: refused;
- a model whose output layer and MTP leave no room for a deeper one-GPU proxy (the 27B: its planner
  puts 8 layers over the H200's memory) takes its slope from two proxies with a small vocabulary and no MTP
  (``model.vocab_size=32768 tokenizer.vocab_size=32768 model.mtp_num_layers=null``, at 4 and 8
  layers) and its fixed cost from a third, at the real head (``--intercept-result``);
- ``without_mtp`` (``--without-mtp``) predicts the recipe as run without its MTP layer (the published
  27B run had none): MTP's cost is taken out of the fixed cost as its share, by training FLOPs per
  token, of what the intercept's real output layer and MTP add over the slope proxies' small head.

The error band propagates each proxy's step-time spread (its CV over the measured window, as a
standard error of the mean) through the extrapolation: t_full = (1 - k) t(d1) + k t(d2) with
k = (L - d1) / (d2 - d1), so the band widens with how far L lies beyond d2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# A prediction is trusted once it lands within this fraction of the published figures it is
# calibrated on (4,663.1 tokens/s/GPU for the 35B-A3B EP8 layout, 2,499.5 for the 27B PP4 one).
CALIBRATION_TOLERANCE = 0.15


class PredictionError(ValueError):
    """Inputs the predictor cannot use; the message names the file or field and the fix."""


# A recomputed layer repeats its forward: a third of its training FLOPs (forward 1, backward 2).
RECOMPUTE_FORWARD_SHARE = 1 / 3


@dataclass(frozen=True)
class ProxyPoint:
    layers: int
    micro_batch_s: float  # step time / micro batches per step
    sem_fraction: float  # standard error of the mean step time, relative
    recipe: str
    source: str
    recompute_fraction: float = 1.0  # share of its layers the proxy recomputed
    mtp_num_layers: int = 0
    head_flops: float = 0.0  # training FLOPs per token of the output layer
    mtp_flops: float = 0.0  # training FLOPs per token of the MTP layers, their output layer included


def recompute_fraction(granularity: str | None, method: str | None, num_layers: int | None, layers: int) -> float:
    """The share of ``layers`` that full recompute repeats: all under ``uniform``, the first
    ``num_layers`` under ``block``, none otherwise (selective recompute repeats parts of layers and
    is not modelled)."""
    if granularity != "full" or not layers:
        return 0.0
    if method == "block":
        return min(num_layers or 0, layers) / layers
    return 1.0


@dataclass
class Prediction:
    recipe: str
    gpus: int
    tokens_per_s_per_gpu: float
    low: float
    high: float
    step_s: float
    per_layer_s: float
    fixed_s: float
    micro_batches: int
    bubble_micro_batches: float
    notes: list[str] = field(default_factory=list)
    published: float | None = None
    stage_micro_batch_s: list[float] = field(default_factory=list)  # each pipeline stage's micro batch

    @property
    def calibration(self) -> dict[str, Any] | None:
        if not self.published:
            return None
        ratio = self.tokens_per_s_per_gpu / self.published
        return {"published": self.published, "ratio": ratio, "within": abs(ratio - 1) <= CALIBRATION_TOLERANCE}

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "calibration": self.calibration}


def _layers_of(doc: dict[str, Any]) -> int:
    found = re.search(r"--scale-down (\d+)", doc.get("command") or "")
    if not found:
        raise PredictionError(f"{doc.get('recipe')}: not a proxy result (its command has no --scale-down LAYERS)")
    return int(found.group(1))


def proxy_point(path: str | Path) -> ProxyPoint:
    """One proxy result file (written by ``benchmark.py --proxy-layers``)."""
    import yaml

    from bridge_recipes.bench.result import read_result

    path = Path(path)
    try:
        doc = read_result(path)
        result, workload, layout = doc["result"], doc["workload"], doc["layout"]
        step_s, cv = float(result["step_time_mean_s"]), float(result["step_time_cv_percent"]) / 100
        first, last = result["window"]
        micro_batches = workload["global_batch"] // (layout["rows_per_microbatch"] * layout["dp"])
    except FileNotFoundError:
        raise PredictionError(f"{path}: no such file") from None
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise PredictionError(f"{path}: not a benchmark result file ({type(exc).__name__}: {exc})") from None
    if not (math.isfinite(step_s) and step_s > 0 and math.isfinite(cv) and cv >= 0):
        raise PredictionError(
            f"{path}: step_time_mean_s {step_s} and step_time_cv_percent {cv * 100} must be finite, the step time "
            "positive: the run's step times were not measured; measure it again"
        )
    steps = last - first + 1
    layers = _layers_of(doc)
    recompute = doc["layout"].get("recompute") or {}
    flops = result.get("flops_per_token") or {}
    parts = flops.get("breakdown") or {}
    return ProxyPoint(
        layers=layers,
        micro_batch_s=step_s / micro_batches,
        sem_fraction=cv / math.sqrt(steps),
        recipe=doc["recipe"],
        source=str(path),
        recompute_fraction=recompute_fraction(
            recompute.get("granularity"), recompute.get("method"), recompute.get("num_layers"), layers
        ),
        mtp_num_layers=int(flops.get("mtp_num_layers") or 0),
        head_flops=float(parts.get("lm_head", 0)),
        mtp_flops=float(sum(v for k, v in parts.items() if k.startswith("mtp_"))),
    )


def mtp_share_s(slope_point: ProxyPoint, intercept: ProxyPoint, fixed_small_s: float, fixed_real_s: float) -> float:
    """Seconds per micro batch of the intercept's fixed cost that its MTP takes: what the real output
    layer and MTP add over the small head, split by their training FLOPs per token."""
    if intercept.mtp_num_layers == 0 or slope_point.mtp_num_layers != 0:
        raise PredictionError(
            f"--without-mtp needs slope proxies without MTP ({slope_point.source}: {slope_point.mtp_num_layers} "
            f"layers) and an intercept with it ({intercept.source}: {intercept.mtp_num_layers})"
        )
    added = intercept.head_flops - slope_point.head_flops + intercept.mtp_flops
    if added <= 0:
        raise PredictionError(f"{intercept.source}: no output-layer or MTP FLOPs recorded in its result")
    return (fixed_real_s - fixed_small_s) * intercept.mtp_flops / added


def stage_recompute_fractions(cfg: Any, stages: list[int]) -> list[float]:
    """Each pipeline stage's share of recomputed layers (block recompute counts per stage)."""
    m = cfg.model
    return [recompute_fraction(m.recompute_granularity, m.recompute_method, m.recompute_num_layers, n) for n in stages]


def predict(
    cfg: Any,
    gpus: int,
    points: list[ProxyPoint],
    *,
    recipe: str,
    ep_comm_s: float | None = None,
    published: float | None = None,
    intercept: ProxyPoint | None = None,
    without_mtp: bool = False,
) -> Prediction:
    """The full-scale prediction for ``cfg`` (the recipe as built) on ``gpus`` GPUs. ``intercept``:
    a proxy with the recipe's real output layer and MTP when the two slope proxies shrank them
    (vocabulary, MTP) to fit more layers on one GPU: the slope is theirs, the fixed cost this
    proxy's time less its layers at that slope."""
    from bridge_recipes.plan.layout import layout_of, stage_layers

    lay = layout_of(cfg, gpus)
    if lay.dp is None:
        raise PredictionError(f"{recipe} does not divide over {gpus} GPUs")
    if lay.tp > 1 or lay.cp > 1:
        raise PredictionError(
            f"{recipe} splits layers over TP{lay.tp} CP{lay.cp}: their communication is not in a one-GPU proxy"
        )
    if len(points) != 2:
        raise PredictionError(f"two proxy results of different depths are needed, got {len(points)}")
    p1, p2 = sorted(points, key=lambda p: p.layers)
    if p1.layers == p2.layers:
        raise PredictionError(f"both proxy results have {p1.layers} layers; measure a second depth")
    for p in (p1, p2, *([intercept] if intercept else [])):
        if p.recipe not in (recipe, recipe.replace("_mock_config", "_config")):
            raise PredictionError(f"{p.source} measured {p.recipe}, not {recipe}")
    if abs(p1.recompute_fraction - p2.recompute_fraction) > 1e-9:
        raise PredictionError(
            f"the two proxies recompute different shares of their layers ({p1.recompute_fraction:.3f} and "
            f"{p2.recompute_fraction:.3f}): their slope mixes recompute into the layer cost"
        )
    slope = (p2.micro_batch_s - p1.micro_batch_s) / (p2.layers - p1.layers)
    base = intercept or p1
    fixed = base.micro_batch_s - slope * base.layers
    notes = []
    if without_mtp:
        if intercept is None:
            raise PredictionError("without_mtp needs intercept_result (a proxy with the real head and MTP)")
        mtp_s = mtp_share_s(p1, intercept, p1.micro_batch_s - slope * p1.layers, fixed)
        fixed -= mtp_s
        # worded as the committed prediction files record it: a rerun must reproduce them byte for byte
        notes.append(f"without MTP: {mtp_s * 1e3:.1f} ms a micro batch of the fixed cost taken out (its FLOP share)")
    comm = 0.0
    if lay.ep > 1:
        if ep_comm_s is None:
            notes.append("no expert-parallel all-to-all measured: an upper bound on tokens/s")
        else:
            comm = ep_comm_s
    stages = stage_layers(cfg) or [cfg.model.num_layers]
    rho, f_proxy = RECOMPUTE_FORWARD_SHARE, p1.recompute_fraction
    layer_s = [slope * (1 + rho * f) / (1 + rho * f_proxy) for f in stage_recompute_fractions(cfg, stages)]
    stage_times = [
        n * (s + comm) + (fixed if i == len(stages) - 1 else 0.0) for i, (n, s) in enumerate(zip(stages, layer_s))
    ]
    micro = cfg.train.global_batch_size // (cfg.train.micro_batch_size * lay.dp)
    bubble = (lay.pp - 1) / (lay.vpp or 1)
    step = (micro + bubble) * max(stage_times)
    tokens = cfg.train.global_batch_size * cfg.model.seq_length / gpus
    # the error of the slowest stage's extrapolation, from both proxies' standard errors
    worst = stages[stage_times.index(max(stage_times))]
    k = (worst - p1.layers) / (p2.layers - p1.layers)
    sigma = math.hypot((1 - k) * p1.sem_fraction * p1.micro_batch_s, k * p2.sem_fraction * p2.micro_batch_s)
    if intercept is not None:  # the fixed cost's own error, and the slope's carried over to it
        k0 = (intercept.layers - p1.layers) / (p2.layers - p1.layers)
        sigma = math.hypot(
            sigma,
            intercept.sem_fraction * intercept.micro_batch_s,
            (1 - k0) * p1.sem_fraction * p1.micro_batch_s,
            k0 * p2.sem_fraction * p2.micro_batch_s,
        )
    rel = 2 * sigma / max(stage_times)  # two standard errors
    rate = tokens / step
    if not (math.isfinite(rate) and rate > 0 and math.isfinite(rel)):
        raise PredictionError(
            f"the proxies give no usable step time for {recipe} (a step of {step} s); check their step times"
        )
    return Prediction(
        recipe=recipe,
        gpus=gpus,
        tokens_per_s_per_gpu=rate,
        low=rate / (1 + rel),
        high=rate / max(1 - rel, 1e-9),
        step_s=step,
        per_layer_s=slope,
        fixed_s=fixed,
        micro_batches=micro,
        bubble_micro_batches=bubble,
        notes=notes,
        published=published,
        stage_micro_batch_s=stage_times,
    )


@dataclass(frozen=True)
class SideBySide:
    """One candidate command's two proxy runs (lab.benchmark --candidate): the published policy and
    the candidate at the same depth, with how many of the proxy's layers the candidate stops recomputing."""

    reference_step_s: float
    candidate_step_s: float
    layers_not_recomputed: int
    micro_batches: int

    @property
    def saved_s(self) -> float:
        """Seconds per micro batch the candidate saves."""
        return (self.reference_step_s - self.candidate_step_s) / self.micro_batches


def split_saving(a: SideBySide, b: SideBySide) -> tuple[float, float]:
    """(fixed, per layer) seconds per micro batch: a candidate's saving as a fixed part (its output-layer,
    loss and optimizer changes, the same in both) plus a part for each layer no longer recomputed,
    solved from two candidates that share the fixed change and differ in how many layers they recompute."""
    if a.layers_not_recomputed == b.layers_not_recomputed:
        raise PredictionError("the two candidates stop recomputing as many layers; nothing separates the parts")
    per_layer = (b.saved_s - a.saved_s) / (b.layers_not_recomputed - a.layers_not_recomputed)
    return a.saved_s - a.layers_not_recomputed * per_layer, per_layer


def proxy_day(base: Prediction, proxy_layers: int, pair: SideBySide) -> float:
    """How much slower (above 1) or faster the published policy ran in a pair's command than the
    calibration (``base``) says for that depth: hosts and days differ, and a saving measured in the
    pair is divided by this to take it to the calibration's units."""
    return pair.reference_step_s / pair.micro_batches / (base.fixed_s + proxy_layers * base.per_layer_s)


def candidate_estimate(
    base: Prediction, proxy_layers: int, pair: SideBySide, fixed_saved_s: float, per_layer_saved_s: float,
    layers_not_recomputed: int, calibrated_saved_s: float = 0.0,
) -> float:  # fmt: skip
    """tokens/s/GPU of a candidate at full scale from its one-depth proxy measurement: the published
    policy's calibrated per-layer and fixed costs (``base``, one pipeline stage), less the saving
    split by :func:`split_saving`, taken to the calibration's units by :func:`proxy_day` of the
    candidate's command, with ``layers_not_recomputed`` of the recipe's layers freed of recompute, and
    less ``calibrated_saved_s`` (seconds per micro batch at full scale, already in the calibration's
    units: a change measured by another pair)."""
    if base.bubble_micro_batches:
        raise PredictionError(f"{base.recipe} has a pipeline: one stage's costs do not describe it")
    day = proxy_day(base, proxy_layers, pair)
    micro = base.step_s / base.micro_batches
    candidate = micro - fixed_saved_s / day - layers_not_recomputed * per_layer_saved_s / day - calibrated_saved_s
    return base.tokens_per_s_per_gpu * micro / candidate


def scaled_saving(base: Prediction, proxy_layers: int, pair: SideBySide, proxy_count: int, full_count: int) -> float:
    """Seconds per micro batch at full scale, in the calibration's units, of a saving that goes with a
    count of things (kernels, weights) rather than with layers: the pair's saving per micro batch over its
    ``proxy_count``, times the recipe's ``full_count``."""
    return pair.saved_s / proxy_day(base, proxy_layers, pair) / proxy_count * full_count


def pipeline_candidate_estimate(
    base: Prediction,
    fixed_s: float,
    layers_no_longer_recomputed: list[int],
    recompute_s: float,
    layer_scale: float = 1.0,
    fixed_saved_s: float = 0.0,
    stage_saved_s: Sequence[float] = (),
) -> float:
    """tokens/s/GPU of a candidate on a pipelined recipe from the prediction of the published policy
    (``base``, with its stage times and ``fixed_s`` on the last stage): each stage's layer time scaled
    by ``layer_scale`` (a faster kernel in every layer), less ``recompute_s`` for each of the stage's
    layers no longer recomputed, the last stage less ``fixed_saved_s`` (its loss), and each stage less
    its ``stage_saved_s`` (seconds per micro batch, for a change whose share differs by stage)."""
    stages = base.stage_micro_batch_s
    if len(layers_no_longer_recomputed) != len(stages):
        raise PredictionError(f"{len(stages)} stages, {len(layers_no_longer_recomputed)} recompute changes given")
    saved = list(stage_saved_s) or [0.0] * len(stages)
    if len(saved) != len(stages):
        raise PredictionError(f"{len(stages)} stages, {len(saved)} stage savings given")
    times = []
    for i, (t, freed) in enumerate(zip(stages, layers_no_longer_recomputed)):
        last = i == len(stages) - 1
        layers_s = t - (fixed_s if last else 0.0)
        own = layers_s * layer_scale - freed * recompute_s - saved[i]
        times.append(own + ((fixed_s - fixed_saved_s) if last else 0.0))
    return base.tokens_per_s_per_gpu * base.step_s / ((base.micro_batches + base.bubble_micro_batches) * max(times))


def with_exposed_comm(rate: float, comm_s: float, layers: int, row_tokens: int, frame: float = 1.0) -> float:
    """tokens/s/GPU of a full-scale estimate made without the expert-parallel all-to-all (``rate``), with
    ``comm_s`` seconds of it left exposed per MoE layer per row (one row's tokens through a layer's dispatch and
    combine, forward and backward), its step first scaled by ``frame`` (one calibration's step over
    another's: the estimate moved to the frame ``comm_s`` was found in). A step of R rows grows by
    ``layers`` x R x ``comm_s``, so the row count cancels: a row's time is ``row_tokens`` / ``rate``."""
    if rate <= 0 or row_tokens <= 0 or layers <= 0 or frame <= 0 or comm_s < 0:
        raise PredictionError(
            f"rate {rate}, layers {layers}, row tokens {row_tokens} and frame {frame} must be positive and the "
            f"all-to-all {comm_s} s not negative"
        )
    return row_tokens / (row_tokens * frame / rate + layers * comm_s)


def comm_to_reach_s(rate: float, target: float, layers: int, row_tokens: int, frame: float = 1.0) -> float:
    """Seconds of exposed all-to-all per MoE layer per row at which an estimate made without it (``rate``,
    its step scaled by ``frame``) falls to ``target`` tokens/s/GPU: the inverse of :func:`with_exposed_comm`.
    Negative when the estimate is already below the target. Given a prediction of the published layout and
    the published figure, it is the all-to-all that would close the calibration's gap."""
    if rate <= 0 or target <= 0 or row_tokens <= 0 or layers <= 0 or frame <= 0:
        raise PredictionError(
            f"rate {rate}, target {target}, layers {layers}, row tokens {row_tokens} and frame {frame} "
            "must be positive"
        )
    return (row_tokens / target - row_tokens * frame / rate) / layers


def two_gpu_ep_comm_s(path: str | Path, target_ep: int, family: str = "qwen35_35b_a3b") -> float:
    """``--ep-comm-s`` from the two-GPU suite's result file (``two_gpu_FAMILY.json``): the NCCL
    all-to-all time of the EP2 run's traced step (``bench.trace_summary``) over its layers and the
    micro batches each GPU runs, scaled from EP2 to ``target_ep`` by the share of a GPU's tokens that
    leave it, (ep - 1) / ep. An upper bound on what the full layout pays: NCCL kernels also count
    the time they wait for the other GPU, and part of the all-to-all may hide behind compute."""
    import json

    from bridge_recipes.bench.trace_summary import ALL_TO_ALL
    from lab.evidence import TWO_GPU_LAYERS, TWO_GPU_LAYOUTS, TWO_GPU_TRAIN_FLAGS

    path = Path(path)
    try:
        breakdown = json.loads(path.read_text())["ep2"]["time_breakdown"]
    except FileNotFoundError:
        raise PredictionError(f"{path}: no such file") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise PredictionError(f"{path}: no EP2 run with a time breakdown ({type(exc).__name__}: {exc})") from None
    if "categories_ms" not in breakdown:
        raise PredictionError(f"{path}: the EP2 run has no trace: {breakdown.get('missing', breakdown)}")
    measured_ep = TWO_GPU_LAYOUTS["ep2"]["flags"]["ep"]
    micro_batches = TWO_GPU_TRAIN_FLAGS["gb"] // measured_ep  # EP2 over two GPUs is DP2, one row per micro batch
    all_to_all = breakdown["categories_ms"].get(ALL_TO_ALL, 0.0) / 1e3
    return all_to_all / (TWO_GPU_LAYERS[family] * micro_batches) * ep_comm_scale(measured_ep, target_ep)


def ep_comm_scale(measured_ep: int, target_ep: int) -> float:
    """How much more all-to-all a token pays at ``target_ep`` than at ``measured_ep``: the share of a GPU's
    tokens that leave it, (ep - 1) / ep, at the one over the other (EP2 to EP8: 7/8 over 1/2, 1.75)."""
    return ((target_ep - 1) / target_ep) / ((measured_ep - 1) / measured_ep)


def report(p: Prediction) -> str:
    lines = [
        f"[predict] {p.recipe} on {p.gpus} GPUs: {p.tokens_per_s_per_gpu:,.1f} tokens/s/GPU "
        f"({p.low:,.1f} - {p.high:,.1f}), step {p.step_s:.2f} s",
        f"[predict] per micro batch: {p.per_layer_s * 1000:.1f} ms per layer, {p.fixed_s * 1000:.1f} ms fixed; "
        f"{p.micro_batches} micro batches + {p.bubble_micro_batches:g} of pipeline bubble",
    ]
    if len(p.stage_micro_batch_s) > 1:
        stages = " / ".join(f"{t * 1000:.1f}" for t in p.stage_micro_batch_s)
        lines.append(f"[predict] pipeline stages, ms per micro batch: {stages}")
    lines += [f"[predict] note: {n}" for n in p.notes]
    if p.calibration:
        c = p.calibration
        lines.append(
            f"[predict] published {c['published']:,.1f}: ratio {c['ratio']:.3f} "
            f"({'within' if c['within'] else 'OUTSIDE'} +-{CALIBRATION_TOLERANCE:.0%})"
        )
    return "\n".join(lines)
