"""How long a run is: its steps set from epochs over SFT rows, and what its steps read, validate and take.

A step reads ``train.global_batch_size`` sequences of ``model.seq_length`` tokens; on packed rows a
sequence holds ``dataset.rows_per_sample`` rows (:func:`bridge_recipes.config.datasets.rows_per_step`). The
rows are read in file order and cycle, so ``epochs=N`` (``--epochs N``) sets ``train.train_iters`` to
the whole steps N passes over the rows fill, floor(N x rows / rows per step): no row is read more
than N times (rounded up), and what is left of a pass (less than one step) is read in the next one.
A rows folder that cannot fill one step is refused: a step would read rows twice.

Validation: Megatron-Bridge validates every ``validation.eval_interval`` steps and once more when
training ends (``pretrain()`` after ``train()``), each time ``validation.eval_iters`` batches of
``validation.eval_global_batch_size`` sequences, when the data has a validation split. A run
shorter than the interval therefore validates once, at its end.

Expected time: the tokens the steps read over the recipe's rate on the card
(:func:`bridge_recipes.recipes.rates.rate_on`: its measured figure on the GPU type it was measured on, an
estimate labelled as such on another card).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from bridge_recipes.config.datasets import real_data, rows_per_sequence, rows_per_step

if TYPE_CHECKING:
    from bridge_recipes.recipes.rates import Rate


def epochs_value_problem(epochs: float) -> str | None:
    """Why ``epochs`` is not a number of passes, or None."""
    if not isinstance(epochs, int | float) or not math.isfinite(epochs) or epochs <= 0:
        return f"epochs={epochs!r} must be a number of passes over the rows > 0 (e.g. epochs=1, epochs=2.5)"
    return None


def training_rows(cfg: Any) -> int | None:
    """The rows of ``cfg``'s SFT rows folder (its manifest's count), or None for other data or a folder
    that cannot be read (the dataset checks say why)."""
    from bridge_recipes.data.integrity import RowsIntegrityError, read_manifest

    d = cfg.dataset
    if type(d).__name__ != "PackedSFTRowsConfig" or not d.path:
        return None
    try:
        return int(read_manifest(d.path)["rows"])
    except (RowsIntegrityError, KeyError, TypeError, ValueError):
        return None


def validation_rows(cfg: Any) -> int | None:
    """The rows of the validation split of ``cfg``'s SFT rows (None: no split, or other data)."""
    from bridge_recipes.data.integrity import RowsIntegrityError, read_manifest

    d = cfg.dataset
    if type(d).__name__ != "PackedSFTRowsConfig" or not d.path:
        return None
    try:
        return int((read_manifest(d.path).get("validation") or {})["rows"])
    except (RowsIntegrityError, KeyError, TypeError, ValueError):
        return None


def too_small(cfg: Any, rows: int) -> str:
    """The refusal of a rows folder of ``rows`` rows (its manifest's count) that cannot fill one step of
    ``cfg``: a rows file that does not hold what the manifest records, a folder without rows or with fewer
    than one sequence joins (no global batch fits: rebuild it), else the global batch that fits."""
    from bridge_recipes.data.integrity import RowsIntegrityError, file_rows_problem

    per_step, k, folder = rows_per_step(cfg), rows_per_sequence(cfg), cfg.dataset.path
    try:
        if problem := file_rows_problem(folder):
            return problem
    except RowsIntegrityError as exc:
        return str(exc)
    rebuild = f"rebuild it from your data with scripts/build_sft_rows.py --out {folder} --overwrite"
    if rows == 0:
        return f"the rows folder {folder} holds no rows: there is nothing to train on; {rebuild}"
    if rows < k:
        return (
            f"the rows folder {folder} holds {rows} rows, fewer than the {k} rows one sequence joins "
            f"(dataset.rows_per_sample): no global batch fills a step; add data and {rebuild}"
        )
    batch = f"{cfg.train.global_batch_size} sequences x {k} rows" if k > 1 else "the global batch"
    lower = f"-gb {rows // k} or lower"
    return (
        f"the rows folder {cfg.dataset.path} holds {rows} rows and one step reads {per_step} ({batch}): the rows "
        f"cannot fill one step; set {lower}, or add data (scripts/build_sft_rows.py)"
    )


def steps_for_epochs(cfg: Any, epochs: float) -> int:
    """The whole steps ``epochs`` passes over ``cfg``'s rows fill; ValueError naming the fix for data
    that is not SFT rows and for rows that cannot fill one step."""
    return _rows_and_steps(cfg, epochs)[1]


def _rows_and_steps(cfg: Any, epochs: float) -> tuple[int, int]:
    """(rows, steps) of :func:`steps_for_epochs`."""
    if problem := epochs_value_problem(epochs):
        raise ValueError(problem)
    rows = training_rows(cfg)
    if rows is None:
        d = cfg.dataset
        if type(d).__name__ == "PackedSFTRowsConfig":
            raise ValueError(f"epochs={epochs:g} counts passes over the rows of dataset.path, and {d.path} has none")
        raise ValueError(
            f"epochs={epochs:g} counts passes over SFT rows, and this run reads other data: pass {real_data(cfg)}"
        )
    per_step = rows_per_step(cfg)
    if rows < per_step:
        raise ValueError(too_small(cfg, rows))
    return rows, max(1, math.floor(epochs * rows / per_step + 1e-9))


def use_epochs(cfg: Any, epochs: float) -> list[str]:
    """Set ``train.train_iters`` for ``epochs`` passes over the rows (:func:`steps_for_epochs`); returns
    the change, one line."""
    rows, steps = _rows_and_steps(cfg, epochs)
    per_step, old = rows_per_step(cfg), cfg.train.train_iters
    cfg.train.train_iters = steps
    return [
        f"train.train_iters: {old} -> {steps} ({epochs:g} epochs of {rows} rows at {per_step} rows per step: "
        f"{steps * per_step / rows:.2f} epochs read)"
    ]


def _count(n: float) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def length_line(cfg: Any) -> str:
    """Steps, the epochs they read (SFT rows) and the tokens, in one line."""
    t = cfg.train
    tokens = t.train_iters * t.global_batch_size * cfg.model.seq_length
    line = f"{t.train_iters} steps x {t.global_batch_size} x {cfg.model.seq_length} tokens = {_count(tokens)} tokens"
    rows = training_rows(cfg)
    if rows:
        line += f"; {t.train_iters * rows_per_step(cfg) / rows:.2f} epochs of {rows} rows"
    return line


def validation_line(cfg: Any) -> str:
    """When the run validates, on what (see the module)."""
    v, iters = cfg.validation, cfg.train.train_iters
    rows_data = type(cfg.dataset).__name__ == "PackedSFTRowsConfig"
    val_rows = validation_rows(cfg)
    if rows_data and val_rows is None:
        return "none (the rows have no val/ split: build them with --val-fraction F or --val-input FILE)"
    if not v.eval_iters:
        return "off (validation.eval_iters=0)"
    if not v.eval_interval:
        return "off (validation.eval_interval is null)"
    batch = v.eval_global_batch_size or cfg.train.global_batch_size
    what = f"{v.eval_iters} batch(es) of {batch} sequences" + (f" from {val_rows} validation rows" if val_rows else "")
    if v.eval_interval > iters:
        return (
            f"once, at the end (step {iters}): validation.eval_interval {v.eval_interval} is longer than the run; "
            f"{what}"
        )
    during = iters // v.eval_interval
    return f"every {v.eval_interval} steps ({during} time(s)) and at the end; {what}"


def expected_seconds(cfg: Any, world_size: int, rate: float) -> float:
    """Seconds the run's steps take at ``rate`` tokens/s per GPU on ``world_size`` GPUs."""
    return cfg.train.train_iters * step_seconds(cfg, world_size, rate)


def step_seconds(cfg: Any, world_size: int, rate: float) -> float:
    """Seconds one step of ``cfg`` takes at ``rate`` tokens/s per GPU on ``world_size`` GPUs."""
    return cfg.train.global_batch_size * cfg.model.seq_length / (rate * world_size)


def speed_line(cfg: Any, world: int, rate: Rate) -> str:
    """``--plan``'s speed: the recipe's rate for the card (``rate``: measured, an estimate, or why none)
    and, on an SFT rows folder, the time one pass over its rows takes at that rate on ``world`` GPUs."""
    line = f"speed: {rate.describe()}" + (f" ({rate.costed})" if rate.costed else "")
    if rate.tokens_per_s_per_gpu is None:
        return line
    rows = training_rows(cfg)
    if rows is None:
        return line + "; with an SFT rows folder (dataset.path=) also the time an epoch of it takes"
    seconds = rows * (cfg.model.seq_length // rows_per_sequence(cfg)) / (rate.tokens_per_s_per_gpu * world)
    at = "at that estimate " if rate.estimate else ""
    return line + f"; {at}an epoch of {rows:,} rows takes about {duration(seconds)} on {world} such GPU(s)"


def duration(seconds: float) -> str:
    """``seconds`` as ``2 h 05 min``, ``7 min`` or ``40 s``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
