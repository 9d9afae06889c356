"""Range checks of a built config's values, run before the layout checks and before launch.

Megatron accepts some values it cannot train with (a NaN learning rate, a warm-up longer than
the run, a top-k above the expert count), refuses others only at launch (Adam betas outside
[0, 1) when torch builds the optimizer, an unknown token dispatcher when the MoE layer is
built) and fails late or misleadingly on others (a zero global batch is reported as a
learning-rate-decay problem; a zero parallel size divides by zero). :data:`RANGES` is the one
table of accepted ranges, each with who refuses a value outside it; fields typed with a fixed
set of choices (``Literal[...]``) accept only those. Each problem names the field, its value,
the accepted range and the fix. The layout checks divide by the parallel sizes, so they run
only when those pass.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

# Megatron-Core keeps iteration counts and token counters in 64-bit integers and the data
# samplers index rows with them; a run longer than a billion steps is a typo, not a plan.
MAX_TRAIN_ITERS = 10**9
# torch.manual_seed and numpy take seeds in [0, 2**32).
MAX_SEED = 2**32 - 1
# Counts end up in torch int64 tensors (consumed samples, batch sizes, sequence lengths).
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Range:
    """The values one field accepts: ``low``/``high`` bounds (open or closed), integers only,
    null allowed, the flag or override that sets it, and ``layout``: the layout checks divide
    by it, so they wait for it."""

    key: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    optional: bool = False
    flag: str | None = None
    layout: bool = False

    def accepts(self, v: Any) -> bool:
        if v is None:
            return self.optional
        if self.integer and not _is_int(v):
            return False
        if not _finite_number(v):
            return False
        if self.low is not None and (v <= self.low if self.low_open else v < self.low):
            return False
        return self.high is None or (v < self.high if self.high_open else v <= self.high)

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None and not (self.integer and self.high == INT64_MAX):
            text = (
                f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
            )
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
            if self.integer and self.high == INT64_MAX:
                text += " that fits 64 bits"
        else:
            text = f"{kind} {'<' if self.high_open else '<='} {self.high:g}"
        return text + (" (or null)" if self.optional else "")

    def how(self) -> str:
        if self.flag and self.flag.startswith("-"):
            return f"set it with {self.flag} N"
        return f"set it with {self.flag or self.key + '='}N"


def _size(key: str, flag: str, optional: bool = False) -> Range:
    return Range(key, low=1, high=INT64_MAX, integer=True, optional=optional, flag=flag, layout=True)


# Every value range checked before launch, and who refuses a value outside it.
RANGES: tuple[Range, ...] = (
    # Sizes Megatron divides by or allocates with (the layout checks need these to hold).
    _size("model.tensor_model_parallel_size", "-tp"),
    _size("model.pipeline_model_parallel_size", "-pp"),
    _size("model.context_parallel_size", "-cp"),
    _size("model.expert_model_parallel_size", "-ep"),
    _size("model.num_layers", "model.num_layers="),
    _size("model.hidden_size", "model.hidden_size="),
    _size("model.num_attention_heads", "model.num_attention_heads="),
    _size("model.seq_length", "-sl"),
    _size("train.global_batch_size", "-gb"),
    _size("train.micro_batch_size", "-mb"),
    _size("train.train_iters", "--max-steps"),
    _size("model.expert_tensor_parallel_size", "-etp", optional=True),
    _size("model.virtual_pipeline_model_parallel_size", "-vp", optional=True),
    _size("model.ffn_hidden_size", "model.ffn_hidden_size=", optional=True),
    _size("model.num_query_groups", "model.num_query_groups=", optional=True),
    _size("model.num_moe_experts", "model.num_moe_experts=", optional=True),
    _size("dataset.seq_length", "-sl", optional=True),
    # rows of --dataset sft-rows joined into one packed sample, and the bound of their token ids
    _size("dataset.rows_per_sample", "dataset.rows_per_sample="),
    _size("dataset.vocab_size", "dataset.vocab_size=", optional=True),
    _size("checkpoint.save_interval", "--save-interval", optional=True),
    # torch.optim.Adam / SGD (and Transformer Engine's FusedAdam) refuse these when the
    # optimizer is built, after the model is.
    Range("optimizer.adam_beta1", low=0, high=1, high_open=True),
    Range("optimizer.adam_beta2", low=0, high=1, high_open=True),
    Range("optimizer.adam_eps", low=0),
    Range("optimizer.weight_decay", low=0),
    Range("optimizer.sgd_momentum", low=0),
    Range("optimizer.decoupled_lr", low=0, optional=True),
    Range("optimizer.decoupled_min_lr", low=0, optional=True),
    # Megatron-Core clips only when clip_grad > 0: a negative value would silently turn it off.
    Range("optimizer.clip_grad", low=0),
    # Megatron-Core's gradient scalers (fp16) assert these.
    Range("optimizer.loss_scale", low=0, low_open=True, optional=True),
    Range("optimizer.initial_loss_scale", low=0, low_open=True),
    Range("optimizer.min_loss_scale", low=0, low_open=True),
    Range("optimizer.loss_scale_window", low=0, low_open=True),
    Range("optimizer.hysteresis", low=1, high=INT64_MAX, integer=True),
    # Megatron-Core's learning-rate scheduler asserts these when it is built.
    Range("scheduler.lr_warmup_init", low=0),
    Range("scheduler.lr_warmup_fraction", low=0, high=1, high_open=True, optional=True),
    Range("scheduler.lr_decay_iters", low=1, high=INT64_MAX, integer=True, optional=True),
    Range("scheduler.lr_wsd_decay_iters", low=1, high=INT64_MAX, integer=True, optional=True),
    Range("scheduler.start_weight_decay", low=0, optional=True),
    Range("scheduler.end_weight_decay", low=0, optional=True),
    # Megatron-Core's TransformerConfig refuses these when the model config is finalized.
    Range("model.moe_shared_expert_intermediate_size", low=1, high=INT64_MAX, integer=True, optional=True),
    Range("model.num_layers_in_first_pipeline_stage", low=1, high=INT64_MAX, integer=True, optional=True),
    Range("model.num_layers_in_last_pipeline_stage", low=1, high=INT64_MAX, integer=True, optional=True),
    # torch.nn.Dropout and torch's normal initialization refuse these when the model is built.
    Range("model.hidden_dropout", low=0, high=1),
    Range("model.attention_dropout", low=0, high=1),
    Range("model.init_method_std", low=0),
    # Megatron-Bridge's LoRA builds rank-dim adapters scaled by alpha / dim, with dropout, when the model is.
    Range("peft.dim", low=1, high=INT64_MAX, integer=True),
    Range("peft.alpha", low=0, low_open=True),
    Range("peft.dropout", low=0, high=1, high_open=True),
)
# The optimizers Megatron-Core builds without extra packages (others need emerging-optimizers).
OPTIMIZERS = ("adam", "sgd")


def _get(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _present(cfg: Any, dotted: str) -> bool:
    """Whether every section on the way to ``dotted`` exists (a field of a section absent from
    this config, e.g. a dataset config without ``seq_length``, is not checked)."""
    *sections, leaf = dotted.split(".")
    obj = cfg
    for part in sections:
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return hasattr(obj, leaf)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def range_problems(cfg: Any, ranges: tuple[Range, ...] = RANGES) -> list[str]:
    """Fields of ``cfg`` outside their :data:`RANGES` entry, each naming the range and the fix."""
    out = []
    for r in ranges:
        if not _present(cfg, r.key):
            continue
        v = _get(cfg, r.key)
        if not r.accepts(v):
            out.append(f"{r.key}={v!r} must be {r.describe()}; {r.how()}")
    return out


def size_problems(cfg: Any) -> list[str]:
    """Sizes that are not integers >= 1. The layout checks need all of these to hold."""
    return range_problems(cfg, tuple(r for r in RANGES if r.layout))


def optimizer_choices() -> tuple[str, ...]:
    """``optimizer.optimizer`` values Megatron-Core can build here."""
    try:
        from megatron.core.optimizer.emerging_optimizers import _EMERGING_OPTIMIZERS, HAVE_EMERGING_OPTIMIZERS
    except ImportError:
        return OPTIMIZERS
    if not HAVE_EMERGING_OPTIMIZERS:
        return OPTIMIZERS
    extra = ("lion", *_EMERGING_OPTIMIZERS)
    return OPTIMIZERS + extra + tuple(f"dist_{n}" for n in extra)


_HINTS: dict[type, dict[str, Any]] = {}


def _literal_choices(cls: type, name: str) -> tuple | None:
    """The values a field typed ``Literal[...]`` (or an optional one) admits, else None."""
    if cls not in _HINTS:
        try:
            _HINTS[cls] = typing.get_type_hints(cls)
        except Exception:  # unresolvable forward references: no choices known
            _HINTS[cls] = {}
    annotation = _HINTS[cls].get(name)
    args = typing.get_args(annotation) if typing.get_origin(annotation) is not typing.Literal else (annotation,)
    literals = [a for a in args if typing.get_origin(a) is typing.Literal]
    if not literals:
        return None
    return tuple(c for lit in literals for c in typing.get_args(lit))


def choice_problems(obj: Any, prefix: str = "", seen: set[int] | None = None) -> list[str]:
    """Fields typed with a fixed set of choices holding another value (Megatron-Core refuses
    them when it builds the part that reads them, e.g. an unknown token dispatcher)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    out = []
    for f in dataclasses.fields(obj):
        if f.name.startswith("_") or not hasattr(obj, f.name):
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += choice_problems(value, f"{prefix}{f.name}.", seen)
            continue
        choices = _literal_choices(type(obj), f.name)
        # null is left alone: Megatron's configs use it for "unset" also where the type omits it
        if choices is not None and value is not None and not isinstance(value, (list, dict)) and value not in choices:
            names = ", ".join(repr(c) for c in choices if c is not None)
            out.append(f"{prefix}{f.name}={value!r} must be one of {names}; set {prefix}{f.name}=VALUE")
    return out


def lora_target_problems(cfg: Any) -> list[str]:
    """LoRA's ``target_modules``: at least one, each a linear the Qwen3.5 models have (or a pattern
    with ``*`` or ``.``, matched by Megatron-Bridge against module paths). An unknown name only
    draws Megatron-Bridge's warning and trains no adapter on it."""
    from bridge_recipes.recipes.base import LORA_TARGETS

    targets = getattr(getattr(cfg, "peft", None), "target_modules", None)
    if getattr(cfg, "peft", None) is None or targets is None:
        return []
    known = ", ".join(LORA_TARGETS)
    if not targets:
        return [f"peft.target_modules is empty: LoRA would train nothing; set peft.target_modules=[{known}]"]
    unknown = [t for t in targets if not isinstance(t, str) or (t not in LORA_TARGETS and not set("*.") & set(t))]
    if unknown:
        return [
            f"peft.target_modules names {', '.join(map(repr, unknown))}, which no linear of these models is called; "
            f"known: {known}"
        ]
    return []


def value_problems(cfg: Any, world_size: int) -> list[str]:
    """Every value range problem of ``cfg`` for ``world_size`` GPUs, each naming field, value, fix."""
    out = []
    if not _is_int(world_size) or world_size < 1:
        out.append(f"world size {world_size!r} must be an integer >= 1; set --world-size N or WORLD_SIZE=N")
    out += range_problems(cfg)
    out += choice_problems(cfg)
    out += _optimizer_problems(cfg)
    out += _learning_rate_problems(cfg)
    out += _model_problems(cfg)
    return out


def _optimizer_problems(cfg: Any) -> list[str]:
    """The sample counter, the optimizer, its loss scale and weight decay, and the step count."""
    out = []
    t, o, s = cfg.train, cfg.optimizer, cfg.scheduler
    # Megatron-Core counts consumed samples (global batch x steps) in a 64-bit integer.
    gb, steps = t.global_batch_size, t.train_iters
    if _is_int(gb) and _is_int(steps) and gb >= 1 and steps >= 1 and gb * steps > INT64_MAX:
        out.append(
            f"train.global_batch_size={gb} x train.train_iters={steps} samples overflow Megatron-Core's 64-bit "
            "sample counter; lower -gb or --max-steps"
        )
    if o.optimizer not in (choices := optimizer_choices()):
        out.append(
            f"optimizer.optimizer={o.optimizer!r} must be one of {', '.join(map(repr, choices))}; "
            "set optimizer.optimizer=adam"
        )
    floor, start = o.min_loss_scale, o.initial_loss_scale
    if _finite_number(floor) and _finite_number(start) and 0 < start < floor:
        out.append(
            f"optimizer.min_loss_scale={floor:g} is above optimizer.initial_loss_scale={start:g}; "
            "Megatron-Core's loss scaler needs min <= initial"
        )
    wd0, wd1 = s.start_weight_decay, s.end_weight_decay
    if _finite_number(wd0) and _finite_number(wd1) and wd1 < wd0:
        out.append(
            f"scheduler.end_weight_decay={wd1:g} is below scheduler.start_weight_decay={wd0:g}; "
            "Megatron-Core's scheduler needs end >= start"
        )
    if _is_int(steps) and steps > MAX_TRAIN_ITERS:
        out.append(
            f"train.train_iters={steps} is over {MAX_TRAIN_ITERS:,} steps; set --max-steps to the steps you mean"
        )
    return out


def _learning_rate_problems(cfg: Any) -> list[str]:
    """Learning rates finite, the peak positive, the floor in [0, peak]; a warm-up shorter than the decay."""
    out = []
    o, s, iters = cfg.optimizer, cfg.scheduler, cfg.train.train_iters
    lr, min_lr = o.lr, o.min_lr
    if not _finite_number(lr) or lr <= 0:
        out.append(f"optimizer.lr={lr!r} must be a finite number > 0; set --lr, e.g. --lr 1e-5")
    if min_lr is not None and (not _finite_number(min_lr) or min_lr < 0):
        out.append(f"optimizer.min_lr={min_lr!r} must be a finite number >= 0; set --min-lr, e.g. --min-lr 1e-6")
    elif min_lr is not None and _finite_number(lr) and lr > 0 and min_lr > lr:
        out.append(f"optimizer.min_lr={min_lr:g} is above optimizer.lr={lr:g}; set --min-lr at most --lr")
    init = s.lr_warmup_init
    if _finite_number(init) and init >= 0 and _finite_number(lr) and lr > 0 and init > lr:
        out.append(
            f"scheduler.lr_warmup_init={init:g} is above optimizer.lr={lr:g}; the warm-up starts below the peak: "
            "set scheduler.lr_warmup_init at most --lr"
        )
    # Warm-up: non-negative and shorter than the decay (which defaults to the whole run).
    warmup = s.lr_warmup_iters
    decay = s.lr_decay_iters if s.lr_decay_iters is not None else iters
    if warmup is not None:
        if not _is_int(warmup) or warmup < 0:
            out.append(f"scheduler.lr_warmup_iters={warmup!r} must be an integer >= 0; set --warmup-iters N")
        elif _is_int(decay) and decay >= 1 and warmup >= decay:
            out.append(
                f"scheduler.lr_warmup_iters={warmup} is not shorter than the {decay} decay steps "
                f"(train.train_iters unless scheduler.lr_decay_iters is set); set --warmup-iters below {decay}"
            )
    return out


def _model_problems(cfg: Any) -> list[str]:
    """Routing within the experts, the LoRA targets, the seed and the recompute settings."""
    out = []
    m = cfg.model
    experts, topk = m.num_moe_experts, m.moe_router_topk
    if _is_int(experts) and experts >= 1 and (not _is_int(topk) or not 1 <= topk <= experts):
        out.append(f"model.moe_router_topk={topk!r} must be between 1 and the {experts} experts")
    out += lora_target_problems(cfg)
    seed = cfg.rng.seed
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        out.append(f"rng.seed={seed!r} must be an integer in [0, {MAX_SEED}]; set rng.seed=N")
    # Selective recompute rebuilds named modules; a method (uniform/block) applies only to full.
    if m.recompute_granularity == "selective" and m.recompute_method is not None:
        out.append(
            f"model.recompute_granularity=selective with model.recompute_method={m.recompute_method!r}: "
            "a method applies to full recompute only; also set model.recompute_method=null "
            "model.recompute_num_layers=null"
        )
    return out
