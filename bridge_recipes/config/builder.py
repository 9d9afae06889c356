"""Build a recipe's config by name, as the runner does: the library's one entry point.

``build(name, ...)`` finds the recipe in the registry (read from the source, nothing imported
until the recipe is built), calls it, and then, in this order: shrinks it to one GPU
(``scale_down``), swaps its data (``dataset``), switches it to LoRA (``peft``), applies the
convenience ``flags`` and then the
Hydra ``overrides`` (which therefore win), and last sets the run's length (``epochs``) and the save
interval that follows it. ``runner_args`` writes the same request as
``scripts/run_recipe.py`` arguments, for launching a training process that builds it again.

Importing this module imports neither torch nor Megatron.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bridge_recipes.config import tracking
from bridge_recipes.config.overrides import FLAG_KEYS, apply_all, flag_option, flag_values
from bridge_recipes.recipes import registry


def _lora(cfg: Any) -> None:
    from bridge_recipes.recipes.base import use_lora

    use_lora(cfg)


# What ``peft=`` / ``--peft`` may name, and how each changes a built recipe.
PEFT_SCHEMES: dict[str, Callable[[Any], None]] = {"lora": _lora}


def build(
    name: str,
    *,
    scale_down: int | None = None,
    scale_experts: int | None = None,
    gpus: int | None = None,
    dataset: str | None = None,
    flags: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    report: Callable[[str], None] | None = None,
    hf_checkpoint: str | None = None,
    peft: str | None = None,
    config_file: str | None = None,
    epochs: float | None = None,
) -> Any:
    """The run of recipe ``name``: a :class:`bridge_recipes.recipe_config.RecipeConfig` (Megatron-Bridge's
    ConfigContainer with the run's ``features``, naming the recipe and its metadata).

    - ``scale_down``: shrink to one GPU with this many layers (a multiple of 4), keeping the
      execution policy; ``scale_experts``: with it, keep this many routed experts; ``gpus``:
      with it, shrink to this many GPUs instead, keeping as much of the recipe's parallel
      layout as fits (:func:`bridge_recipes.recipes.scaledown.fit_layout`). The global
      batch stays the recipe's (set ``flags={"gb": ...}`` to change it).
    - ``dataset``: ``mock`` | ``sft-rows`` | ``energon`` (see :mod:`bridge_recipes.config.datasets`).
    - ``flags``: convenience-flag values by name (``tp``, ``pp``, ``gb``, ``max_steps``, ``lr``,
      ``save_dir``, ...; :data:`bridge_recipes.config.overrides.FLAG_KEYS`), read as each flag's type.
    - ``overrides``: Hydra ``KEY=VALUE`` tokens (``a.b=1``, ``+env_vars.X=1``, ``~peft``).
    - ``report``: called with each change the build makes beyond the recipe: scale-down
      (``scale-down: field: old -> new``), the checkpoint's shape (``hf checkpoint: field: old ->
      new ...``) and, on rows with conversation boundaries, the rows per micro batch the recipe declares
      joined into one packed sequence (``packed rows: field: old -> new``, after the overrides;
      ``packed_rows.join_recipe_rows``). A micro batch above 1 that the recipe does not declare is
      left as it is, for the dry run to refuse on such rows.
    - ``hf_checkpoint``: a local Hugging Face folder to start from: checked to be of the recipe's
      model family, its ``config.json`` made the model's shape (after the scale-down, whose LAYERS
      must be its layer count; its experts are kept), its tokenizer made the run's (before the
      overrides, which still win), and checked against the model after the overrides. Converting
      it is the launch's job (:mod:`bridge_recipes.hf.run_hooks`).
    - ``config_file``: build from this saved config (:mod:`bridge_recipes.config.files`) instead
      of calling the recipe; ``name`` is then the recipe it was written from, whose features fill
      those the file leaves out (``config file ... has no ...`` reported). The file is already
      resolved, so ``scale_down`` and ``dataset`` are refused with it; flags and overrides apply.
    - ``epochs``: the run's length in passes over its SFT rows: ``train.train_iters`` from the rows
      folder's row count and the rows per step, set last (``epochs: ...`` reported;
      :mod:`bridge_recipes.config.run_length`). Refused with a step count (``max_steps``, ``train.train_iters=``),
      with data other than SFT rows and with rows that cannot fill one step.

    Last, a run that saves and whose ``checkpoint.save_interval`` no flag, override or config file gives
    saves at an interval set from its length and the recipe's measured rate (``save interval: ...``
    reported; :mod:`bridge_recipes.config.save_interval`).

    A recipe that resumes from its save folder (load == save) keeps doing so when only the
    save folder moves; its TensorBoard folder and the W&B defaults follow the save folder
    (:mod:`bridge_recipes.config.tracking`), and logging to W&B without the wandb package is a
    ValueError. Raises :class:`bridge_recipes.recipes.registry.UnknownRecipe` for an unknown name,
    :class:`bridge_recipes.config.overrides.OverrideError` (a ValueError) for a bad flag or override,
    ValueError for a bad scale-down or dataset.
    """
    values = flag_values(dict(flags or {}))
    _check_request(scale_down, scale_experts, gpus, peft, config_file, dataset)
    if epochs is not None and (problem := epochs_conflict(epochs, values, overrides)):
        raise ValueError(problem)
    cfg = _base_config(name, config_file, report)
    folder = None
    if hf_checkpoint is not None:
        folder, scale_experts = _open_checkpoint(cfg, hf_checkpoint, scale_down, scale_experts)
    if scale_down is not None:
        _shrink(cfg, scale_down, scale_experts, gpus, report)
    _reshape(cfg, folder, dataset, peft, report)
    given = _apply_flags_and_overrides(cfg, values, overrides, name)
    _settle(cfg, folder, epochs, report or (lambda change: None))
    if config_file is None and SAVE_INTERVAL_KEY not in given:  # a config file's interval is kept, as given
        _follow_run_length(cfg, name, scale_down is not None, report or (lambda change: None))
    return cfg


# The field of the save interval: given (flag, override, config file), it is kept; else it follows the run.
SAVE_INTERVAL_KEY = "checkpoint.save_interval"


def _follow_run_length(cfg: Any, name: str, scaled: bool, report: Callable[[str], None]) -> None:
    """The save interval from the run's settled length and, where recipe ``name``'s measured rate times
    the run on the recipe's own card and GPUs (``scaled``: shrunk; :func:`bridge_recipes.recipes.rates.run_rate`),
    the seconds a step takes (:mod:`bridge_recipes.config.save_interval`); the change reported."""
    from bridge_recipes.config.run_length import step_seconds
    from bridge_recipes.config.save_interval import follow_run
    from bridge_recipes.hardware.gpus import gpu_key
    from bridge_recipes.recipes.rates import run_rate

    entry = registry.find(name)
    try:
        card = gpu_key(entry.meta.gpu)
    except KeyError:
        card = entry.meta.gpu
    gpus = entry.meta.gpus
    rate = run_rate(entry.alias_of or entry.name, card, cfg, world=gpus, recipe_gpus=gpus, scaled=scaled)
    seconds = step_seconds(cfg, gpus, rate.tokens_per_s_per_gpu) if rate.tokens_per_s_per_gpu else None
    for change in follow_run(cfg, seconds):
        report(f"save interval: {change}")


def _settle(cfg: Any, folder: Any, epochs: float | None, report: Callable[[str], None]) -> None:
    """What follows the overrides, in order: home folders expanded, the checkpoint checked against the
    model, the recipe's rows per micro batch joined on rows with boundaries, and last the steps of
    ``epochs`` (the rows per step are settled then)."""
    for change in expand_home(cfg):
        report(change)
    if folder is not None:
        from bridge_recipes.hf import run_hooks as hf_training

        hf_training.check_model(cfg, folder)  # after model.* overrides: the weights must fit the model
    from bridge_recipes.data.packed_rows import join_recipe_rows

    for change in join_recipe_rows(cfg):  # rows with boundaries: the recipe's rows per micro batch as one sequence
        report(f"packed rows: {change}")
    if epochs is not None:
        from bridge_recipes.config.run_length import use_epochs

        for change in use_epochs(cfg, epochs):
            report(f"epochs: {change}")


# What sets the run's length in steps, which ``epochs`` sets from the rows instead.
STEP_KEYS = ("train.train_iters", "train.train_samples")


def epochs_conflict(epochs: float, flags: Mapping[str, Any], overrides: Sequence[str]) -> str | None:
    """Why ``epochs`` cannot be used with the rest of a request (a bad value, or a step count also given),
    or None; answered before anything is built."""
    from bridge_recipes.config.overrides import parse
    from bridge_recipes.config.run_length import epochs_value_problem

    if problem := epochs_value_problem(epochs):
        return problem
    if flags.get("max_steps") is not None:
        steps = flags["max_steps"]
        return f"epochs={epochs:g} sets the steps from the rows, and --max-steps {steps} sets them too; pass one"
    for token in overrides:
        key = parse(token).key
        if key in STEP_KEYS:
            return f"epochs={epochs:g} sets the steps from the rows, and {token} sets the run's length too; pass one"
    return None


def peft_problem(peft: str) -> str | None:
    """Why ``peft`` names no scheme of :data:`PEFT_SCHEMES` (a word for "none" says how to train every weight);
    None when it names one."""
    from bridge_recipes.config.overrides import WITHOUT_PEFT, means_none

    if peft in PEFT_SCHEMES:
        return None
    if means_none(peft):
        return f"peft={peft} is not an adapter scheme ({', '.join(PEFT_SCHEMES)}): leave it out; {WITHOUT_PEFT}"
    return f"peft={peft!r} is not known; choose one of {', '.join(PEFT_SCHEMES)}"


def _check_request(
    scale_down: int | None,
    scale_experts: int | None,
    gpus: int | None,
    peft: str | None,
    config_file: str | None,
    dataset: str | None,
) -> None:
    """The keywords of :func:`build` that cannot go together, refused before anything is built."""
    if peft is not None and (problem := peft_problem(peft)):
        raise ValueError(problem)
    if scale_experts is not None and scale_down is None:
        raise ValueError("scale_experts needs scale_down=LAYERS (it shrinks a scaled-down model's experts)")
    if gpus is not None and scale_down is None:
        raise ValueError(f"gpus={gpus} needs scale_down=LAYERS (it is the GPU count the recipe is shrunk to)")
    if config_file is not None and (scale_down is not None or dataset):
        raise ValueError(
            "--scale-down and --dataset reshape a recipe; a config file is already resolved: "
            "save it with them, or set its fields with KEY=VALUE overrides"
        )


def _base_config(name: str, config_file: str | None, report: Callable[[str], None] | None = None) -> Any:
    """The run before any change: the saved ``config_file`` (named after recipe ``name``, whose features
    fill those the file leaves out, ``report`` told), else recipe ``name`` called; a
    :class:`bridge_recipes.recipe_config.RecipeConfig` either way."""
    if config_file is None:
        return registry.load(name)()
    from bridge_recipes.config import files as config_files

    cfg = config_files.load(config_file, name, report)
    cfg.name_recipe(name, registry.find(name).meta)
    return cfg


def _open_checkpoint(
    cfg: Any, hf_checkpoint: str, scale_down: int | None, scale_experts: int | None
) -> tuple[Any, int | None]:
    """The ``--hf-checkpoint`` folder, checked to be of the recipe's family, and the experts a
    scale-down keeps for it."""
    from bridge_recipes.hf import run_hooks as hf_training

    folder = hf_training.inspect(hf_checkpoint)
    hf_training.check_family(cfg, folder, sized=scale_down is None)  # no scale-down: the recipe's size too
    if scale_down is not None:
        scale_experts = _checkpoint_scale(cfg, folder, scale_down, scale_experts)
    return folder, scale_experts


def _shrink(
    cfg: Any, layers: int, experts: int | None, gpus: int | None, report: Callable[[str], None] | None
) -> None:
    """Scale ``cfg`` down to ``layers`` layers on ``gpus`` GPUs (one by default), keeping its global batch."""
    from bridge_recipes.recipes.scaledown import scale_down as shrink

    for change in shrink(
        cfg,
        num_layers=layers,
        num_experts=experts,
        global_batch_size=cfg.train.global_batch_size,
        gpus=1 if gpus is None else gpus,
    ):
        if report:
            report(f"scale-down: {change}")


def _reshape(
    cfg: Any, folder: Any, dataset: str | None, peft: str | None, report: Callable[[str], None] | None
) -> None:
    """The checkpoint's model shape, the data and the adapters, then the checkpoint's tokenizer and weights."""
    if folder is not None:
        from bridge_recipes.hf import run_hooks as hf_training

        for change in hf_training.take_shape(cfg, folder):  # the model's shape is the checkpoint's
            if report:
                report(f"hf checkpoint: {change} (from its config.json)")
    if dataset:
        from bridge_recipes.config import datasets

        datasets.select(cfg, dataset)
    if peft is not None:
        PEFT_SCHEMES[peft](cfg)
    if folder is not None:
        hf_training.use_checkpoint(cfg, folder)


# The config fields that name a folder or file on this machine: a leading ~ is the home folder there,
# as the shell and the dataset builders read it (the config would otherwise hold a folder named "~").
PATH_FIELDS = (
    "dataset.path",
    "dataset.tokenizer_path",
    "checkpoint.save",
    "checkpoint.load",
    "checkpoint.pretrained_checkpoint",
)


def expand_home(cfg: Any) -> list[str]:
    """A leading ``~`` of :data:`PATH_FIELDS` expanded to the home folder; ValueError for a field that holds
    something other than one path (a list, from a config file). Returns the changes, one line each."""
    import os

    changes = []
    for key in PATH_FIELDS:
        section, field = key.split(".")
        holder = getattr(cfg, section, None)
        value = getattr(holder, field, None) if holder is not None else None
        if value is None:
            continue
        if not isinstance(value, str | os.PathLike):
            raise ValueError(
                f"{key} is {type(value).__name__} {value!r}, not one path: give a single folder ({key}=/path/to/dir)"
            )
        text = os.fspath(value)
        if isinstance(text, str) and text.startswith("~"):
            setattr(holder, field, os.path.expanduser(text))
            changes.append(f"{key}: {text} -> {getattr(holder, field)} (~ is the home folder)")
    return changes


def _apply_flags_and_overrides(cfg: Any, values: dict[str, Any], overrides: Sequence[str], name: str) -> set[str]:
    """The convenience flags, then the overrides; the load folder and the trackers follow the save folder.
    Returns the keys they set."""
    ckpt = cfg.checkpoint
    resumes_from_save, recipe_load = bool(ckpt.save) and ckpt.load == ckpt.save, ckpt.load
    before = tracking.snapshot(cfg)
    applied = apply_all(cfg, values, list(overrides))
    _agree_ddp_and_optimizer(cfg, {o.key for o in applied})
    if resumes_from_save and ckpt.load == recipe_load:
        ckpt.load = ckpt.save  # a recipe that resumes from its save folder keeps doing so when only save moves
    tracking.follow_save(cfg, before, [o.key for o in applied], name)  # TensorBoard and W&B folders
    if problem := tracking.problem(cfg):
        raise ValueError(problem)
    return {o.key for o in applied}


# Settings that Megatron-Bridge's validation turns on in both the DDP and the optimizer config when
# either has it on, with a warning.
DDP_AND_OPTIMIZER = ("use_distributed_optimizer", "overlap_param_gather")


def _agree_ddp_and_optimizer(cfg: Any, overridden: set[str]) -> None:
    """Make ``ddp.X`` and ``optimizer.X`` agree for each of :data:`DDP_AND_OPTIMIZER` before the
    config is validated or saved: an override of one of the two sets both, otherwise either being on
    turns both on, as Megatron-Bridge would at validation, so that the config says what runs."""
    ddp, optimizer = cfg.ddp, cfg.optimizer
    for field in DDP_AND_OPTIMIZER:
        named = [s for key, s in ((f"ddp.{field}", ddp), (f"optimizer.{field}", optimizer)) if key in overridden]
        on = getattr(named[0], field) if len(named) == 1 else getattr(ddp, field) or getattr(optimizer, field)
        setattr(ddp, field, bool(on))
        setattr(optimizer, field, bool(on))


def _checkpoint_scale(cfg: Any, folder: Any, layers: int, experts: int | None) -> int | None:
    """The experts ``--scale-down`` keeps for a checkpoint: its own count where it has fewer than
    the recipe. LAYERS and ``--scale-experts`` must be the checkpoint's (its weights set the shape)."""
    from bridge_recipes.hf.run_hooks import layers_and_experts

    have_layers, have_experts = layers_and_experts(folder)
    if layers != have_layers:
        raise ValueError(
            f"--scale-down {layers}: the --hf-checkpoint has {have_layers} layers; pass --scale-down {have_layers}"
        )
    if experts is not None and experts != have_experts:
        raise ValueError(
            f"--scale-experts {experts}: the --hf-checkpoint has {have_experts} routed experts; "
            "drop --scale-experts (the checkpoint's count is used)"
        )
    recipe_experts = getattr(cfg.model, "num_moe_experts", None)
    return have_experts if have_experts and recipe_experts and have_experts < recipe_experts else None


def runner_args(
    *,
    scale_down: int | None = None,
    scale_experts: int | None = None,
    gpus: int | None = None,
    dataset: str | None = None,
    flags: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    hf_checkpoint: str | None = None,
    peft: str | None = None,
    config_file: str | None = None,
    epochs: float | None = None,
) -> list[str]:
    """``scripts/run_recipe.py`` arguments (after ``--recipe NAME``) that build what
    :func:`build` builds with the same keywords: scale-down, dataset, flags in their table's
    order, then the overrides."""
    args: list[str] = ["--config-file", config_file] if config_file is not None else []
    if scale_down is not None:
        args += ["--scale-down", str(scale_down)]
        if scale_experts is not None:
            args += ["--scale-experts", str(scale_experts)]
        if gpus is not None:
            args += ["--gpus", str(gpus)]
    if dataset:
        args += ["--dataset", dataset]
    if hf_checkpoint is not None:
        args += ["--hf-checkpoint", hf_checkpoint]
    if peft is not None:
        args += ["--peft", peft]
    if epochs is not None:
        args += ["--epochs", str(epochs)]
    values = flag_values(dict(flags or {}))
    for dest in FLAG_KEYS:
        if dest in values:
            args += [flag_option(dest), str(values[dest])]
    return [*args, *overrides]
