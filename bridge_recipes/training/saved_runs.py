"""What a Megatron-Bridge checkpoint folder says about the run that saved it.

A run's ``checkpoint.save`` folder holds ``latest_checkpointed_iteration.txt`` (the newest
iteration, as digits) and one ``iter_NNNNNNN`` folder per save, each with the run's finalized
config as ``run_config.yaml``. The runner's resume checks read the saved layout from it, and the
Hugging Face export reads whether the run trained LoRA adapters (``peft``) and their settings.
The launch also writes ``run_identity.json`` there (:func:`run_identity`): what the run is, so that
a later run of another recipe, model, starting weights, data, sequence length or LoRA setting is
refused rather than resumed from it. A tracker that names a step with no ``iter_*`` folder, or
saved steps with no tracker, is refused (:func:`tracker_problem`) rather than read as "no LoRA" or
"no checkpoint".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TRACKER = "latest_checkpointed_iteration.txt"
TRAIN_STATE = "latest_train_state.pt"  # Megatron-Bridge's own tracker, read before TRACKER when present
RUN_CONFIG = "run_config.yaml"
ITERATION_PREFIX = "iter_"
RELEASE = "release"  # a tracker naming Megatron's released form (its folder "release"), not a step


class CheckpointMetadataError(ValueError):
    """A checkpoint folder whose metadata cannot be read; the message names the file."""


def iteration_folder(folder: str | Path, iteration: int) -> Path:
    return Path(folder) / f"{ITERATION_PREFIX}{iteration:07d}"


def saved_steps(folder: str | Path) -> list[int]:
    """The steps of the ``iter_NNNNNNN`` folders in ``folder``, in order."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    names = [p.name[len(ITERATION_PREFIX) :] for p in folder.glob(f"{ITERATION_PREFIX}*") if p.is_dir()]
    return sorted(int(n) for n in names if n.isdigit())


def iteration_of(folder: str | Path) -> int | None:
    """The step of ``folder`` when it is one iteration folder itself (``.../iter_0000100``; Megatron-Bridge
    loads such a folder directly), else None."""
    folder = Path(folder)
    step = folder.name[len(ITERATION_PREFIX) :]
    return int(step) if folder.name.startswith(ITERATION_PREFIX) and step.isdigit() and folder.is_dir() else None


def holds_checkpoint(folder: str | Path) -> bool:
    """Whether ``folder`` holds a tracker file or an iteration folder (a checkpoint, or the start of one)."""
    folder = Path(folder)
    return (folder / TRACKER).is_file() or (folder / TRAIN_STATE).is_file() or bool(saved_steps(folder))


def tracker_problem(folder: str | Path) -> str | None:
    """Why ``folder``'s tracker and its iteration folders disagree, or None: a tracker that is not a step
    number or names a step with no ``iter_*`` folder, or finished saves (``run_config.yaml`` inside) with
    no tracker naming the newest (Megatron would start over and save onto them)."""
    folder = Path(folder)
    tracker, steps = folder / TRACKER, saved_steps(folder)
    present = f"steps saved there: {', '.join(map(str, steps))}" if steps else "no iter_* folder is there"
    fix = f"write the newest step into it (echo {steps[-1]} > {tracker})" if steps else f"remove {tracker}"
    if (folder / TRAIN_STATE).is_file():  # Megatron-Bridge reads its own tracker first
        own = f"copy {iteration_folder(folder, steps[-1]) / 'train_state.pt'} to" if steps else "remove"
        fix += f" and {own} {folder / TRAIN_STATE}"
    if not tracker.is_file():
        finished = [s for s in steps if (iteration_folder(folder, s) / RUN_CONFIG).is_file()]
        if finished and not (folder / TRAIN_STATE).is_file():
            return (
                f"{folder} holds saved steps ({', '.join(map(str, finished))}) but no {TRACKER} naming the newest "
                f"(Megatron finds no checkpoint there without it, and a run would save onto them); write the step "
                f"to load into it (echo {finished[-1]} > {tracker})"
            )
        return None
    try:
        text = tracker.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        return f"{tracker} cannot be read ({type(exc).__name__}; {present}); {fix}"
    if text == RELEASE:
        return None
    if not text.isdigit():
        return f"{tracker} holds {text[:40]!r}, not a step number ({present}); {fix}"
    wanted = iteration_folder(folder, int(text))
    if wanted.is_dir():
        return None
    return f"{tracker} names step {int(text)}, but {folder} holds no {wanted.name} ({present}); {fix}"


def latest_iteration(folder: str | Path) -> int | None:
    """The newest saved iteration of ``folder`` (its tracker file), or None when there is none."""
    tracker = Path(folder) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() else None


def read_run_config(path: Path) -> dict:
    """``run_config.yaml`` as plain maps (Python tags read as None: only plain fields are needed)."""
    import yaml

    class _Lenient(yaml.SafeLoader):
        pass

    _Lenient.add_multi_constructor("", lambda loader, suffix, node: None)
    try:
        loaded = yaml.load(path.read_text(), Loader=_Lenient) or {}
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        raise CheckpointMetadataError(f"{path} cannot be read as YAML ({type(exc).__name__})") from None
    if not isinstance(loaded, dict) or any(
        not isinstance(loaded.get(k) or {}, dict) for k in ("model", "checkpoint", "optimizer", "dist", "peft")
    ):
        raise CheckpointMetadataError(f"{path} is not a Megatron-Bridge run config (sections must be maps)")
    return loaded


def latest_run_config(folder: str | Path) -> tuple[int, dict] | None:
    """(iteration, run_config) of the newest checkpoint in ``folder``, or None when there is none;
    ({}) when that iteration has no run_config.yaml. CheckpointMetadataError when the tracker and the
    iteration folders disagree (:func:`tracker_problem`)."""
    if (step := iteration_of(folder)) is not None:
        run_config = Path(folder) / RUN_CONFIG
        return step, read_run_config(run_config) if run_config.is_file() else {}
    if problem := tracker_problem(folder):
        raise CheckpointMetadataError(problem)
    iteration = latest_iteration(folder)
    if iteration is None:
        return None
    run_config = iteration_folder(folder, iteration) / RUN_CONFIG
    if not run_config.is_file():
        return iteration, {}
    return iteration, read_run_config(run_config)


# --- the run a checkpoint folder belongs to --------------------------------------------------------
# The launch writes IDENTITY into its save folder; a run that would resume a checkpoint (its load
# folder) or save beside one compares its own identity with it first. A run is the recipe, the
# model's architecture, the starting weights (by a key of their content), the data (a rows folder by
# its content hash), the sequence length and the LoRA settings; the parallel layout, the step count
# and the learning rate are not: they may change between a run and its resumption.

IDENTITY = "run_identity.json"
# Architecture fields a checkpoint's weights are shaped by: a run of another value cannot load them.
ARCHITECTURE_FIELDS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "num_moe_experts",
    "moe_ffn_hidden_size",
    "vocab_size",
    "linear_num_value_heads",
)
FRESH_PREFIX = "fresh_"  # --fresh: a new run in <save>/fresh_<N>, the first N not taken


def lora_settings(peft: Any) -> dict | None:
    """The adapter settings of a config's ``peft`` (None: all weights train)."""
    if peft is None:
        return None
    return {
        "scheme": type(peft).__name__,
        "dim": getattr(peft, "dim", None),
        "alpha": getattr(peft, "alpha", None),
        "dropout": getattr(peft, "dropout", None),
        "target_modules": sorted(getattr(peft, "target_modules", None) or []),
        "exclude_modules": sorted(getattr(peft, "exclude_modules", None) or []),
    }


def data_identity(dataset: Any) -> dict:
    """The data of a run: a rows folder by the content hash its manifest records, other data by kind and path."""
    path = getattr(dataset, "path", None)
    if type(dataset).__name__ == "PackedSFTRowsConfig" and path:
        from bridge_recipes.data.integrity import RowsIntegrityError, read_manifest

        try:
            manifest = read_manifest(path)
        except RowsIntegrityError:  # the dataset checks name the problem
            return {"kind": "sft-rows", "path": os.path.abspath(str(path))}
        return {
            "kind": "sft-rows",
            "path": os.path.abspath(str(path)),
            "rows": manifest.get("rows"),
            "rows_sha256": manifest.get("rows_sha256"),
        }
    blend = getattr(dataset, "blend", None)
    where = path or blend
    return {"kind": type(dataset).__name__, "path": str(where) if where is not None else None}


# The weights key reads this many windows of this many bytes, spread evenly over each weight file: two
# checkpoints of one shape but other weights (a Qwen3.5 and a Qwen3.6 folder) differ in every window,
# and a folder copied elsewhere (new paths, new file times) keeps its key. A few MiB per checkpoint.
KEY_WINDOWS = 32
KEY_WINDOW_BYTES = 4096
_KEYS: dict[tuple, str] = {}  # weights keys computed in this process, by the files' paths, sizes and times


def weights_key(files: list[Path], root: Path) -> str | None:
    """A key of the content of ``files`` (under ``root``): their names relative to ``root``, sizes and
    :data:`KEY_WINDOWS` windows of bytes each; None when a file cannot be read."""
    import hashlib

    try:
        stats = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    except OSError:
        return None
    if stats in _KEYS:
        return _KEYS[stats]
    h = hashlib.sha256()
    try:
        for file, size, _ in stats:
            h.update(f"{Path(file).relative_to(root)} {size}\n".encode())
            with open(file, "rb") as f:
                span = max(size - KEY_WINDOW_BYTES, 0)
                for i in range(KEY_WINDOWS):
                    f.seek(span * i // (KEY_WINDOWS - 1))
                    h.update(f.read(KEY_WINDOW_BYTES))
    except OSError:
        return None
    _KEYS[stats] = h.hexdigest()[:32]
    return _KEYS[stats]


HF_WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json")


def is_hf_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a Hugging Face checkpoint (config.json and weights) and no Megatron one."""
    folder = Path(folder)
    weights = any((folder / name).is_file() for name in HF_WEIGHT_FILES) or any(folder.glob("*.safetensors"))
    return (folder / "config.json").is_file() and weights and not holds_checkpoint(folder)


def starting_weights(cfg: Any) -> dict | None:
    """The weights a run starts from: the ``--hf-checkpoint`` folder (``checkpoint.hf_source_path``) by
    the key of its safetensors, else ``checkpoint.pretrained_checkpoint`` (a Megatron checkpoint) by the
    key of its newest iteration's files; None when it names none (random initialization)."""
    c = cfg.checkpoint
    hf, megatron = getattr(c, "hf_source_path", None), getattr(c, "pretrained_checkpoint", None)
    if isinstance(hf, str | os.PathLike) and is_hf_folder(hf):
        root = Path(hf).expanduser().resolve()
        files = sorted(root.glob("*.safetensors"))
        return {"kind": "Hugging Face folder", "path": str(root), "weights_key": weights_key(files, root)}
    if not isinstance(megatron, str | os.PathLike) or not str(megatron):
        return None
    root = Path(megatron).expanduser().resolve()
    iteration = latest_iteration(root) if not tracker_problem(root) else None
    where = iteration_folder(root, iteration) if iteration is not None else root
    files = sorted(p for p in where.rglob("*") if p.is_file()) if where.is_dir() else []
    return {
        "kind": "Megatron checkpoint",
        "path": str(root),
        "weights_key": weights_key(files, root) if files else None,
    }


def run_identity(cfg: Any, recipe: str) -> dict:
    """What identifies the run ``cfg`` of recipe ``recipe`` (see :data:`IDENTITY`)."""
    m = cfg.model
    return {
        "recipe": recipe,
        "model": {
            "hf_model_id": getattr(m, "hf_model_id", None),
            **{f: getattr(m, f, None) for f in ARCHITECTURE_FIELDS},
        },
        "start": starting_weights(cfg),
        "data": data_identity(cfg.dataset),
        "seq_length": m.seq_length,
        "lora": lora_settings(getattr(cfg, "peft", None)),
    }


def read_identity(folder: str | Path) -> dict | None:
    """The identity the launch wrote into ``folder``, or None when there is none."""
    path = Path(folder) / IDENTITY
    if not path.is_file():
        return None
    try:
        loaded = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, OSError) as exc:
        raise CheckpointMetadataError(f"{path} cannot be read as JSON ({type(exc).__name__})") from None
    if not isinstance(loaded, dict):
        raise CheckpointMetadataError(f"{path} is not a run identity (a JSON object)")
    return loaded


def write_identity(folder: str | Path, identity: dict) -> Path:
    """Write ``identity`` into ``folder`` (created if need be); returns the file."""
    from bridge_recipes.utils.outputs import write_text_atomic

    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / IDENTITY
    write_text_atomic(path, json.dumps(identity, indent=1, sort_keys=True) + "\n")
    return path


def identity_of_run_config(run_config: dict) -> dict:
    """What a checkpoint's ``run_config.yaml`` tells of its run's identity, for a folder saved without
    :data:`IDENTITY`: the sequence length and the LoRA settings (the architecture is compared by the
    resume checks, the recipe and the rows' content are not recorded there)."""
    if not run_config:
        return {}
    model, peft = run_config.get("model") or {}, run_config.get("peft")
    out: dict[str, Any] = {}
    if model.get("seq_length") is not None:
        out["seq_length"] = model["seq_length"]
    if peft is None:
        out["lora"] = None
    else:
        lora = {k: peft[k] for k in ("dim", "alpha", "dropout") if peft.get(k) is not None}
        lora |= {k: sorted(peft[k]) for k in ("target_modules", "exclude_modules") if peft.get(k) is not None}
        if peft.get("_target_"):
            lora["scheme"] = str(peft["_target_"]).rsplit(".", 1)[-1]
        out["lora"] = lora
    return out


def _lora_differs(saved: dict | None, this: dict | None) -> bool:
    """Whether two LoRA settings differ, in what both record (a run_config.yaml may hold fewer)."""
    if saved is None or this is None:
        return (saved is None) != (this is None)
    return any(saved[k] != this[k] for k in saved.keys() & this.keys())


def lora_words(lora: dict | None) -> str:
    if lora is None:
        return "full fine-tuning (no LoRA)"
    targets = ", ".join(lora.get("target_modules") or []) or "no targets"
    return (
        f"{lora.get('scheme', 'LoRA')} rank {lora.get('dim')} alpha {lora.get('alpha')} "
        f"dropout {lora.get('dropout')} on {targets}"
    )


def _start_differs(saved: dict | None, this: dict | None) -> bool:
    """Whether two runs start from other weights: by their keys when both have one, else by path."""
    if saved is None or this is None:
        return (saved is None) != (this is None)
    if saved.get("kind") != this.get("kind"):
        return True
    if saved.get("weights_key") and this.get("weights_key"):
        return saved["weights_key"] != this["weights_key"]
    return saved.get("path") != this.get("path")


def start_words(start: dict | None) -> str:
    """How a run's starting weights (:func:`starting_weights`) are named in a message."""
    if start is None:
        return "no starting weights (random initialization)"
    key = start.get("weights_key")
    return f"{start.get('kind')} {start.get('path')}" + (f" (weights key {str(key)[:12]})" if key else "")


def _data_words(data: dict) -> str:
    if data.get("rows_sha256"):
        return f"rows {data.get('path')} ({data.get('rows')} rows, sha256 {str(data['rows_sha256'])[:12]})"
    return f"{data.get('kind')} {data.get('path')}" if data.get("path") else str(data.get("kind"))


def identity_differences(saved: dict, this: dict) -> list[str]:
    """How the run ``this`` differs from the run ``saved`` (each ``what: saved -> this``), comparing only
    what both record."""
    out = []
    if "recipe" in saved and "recipe" in this and saved["recipe"] != this["recipe"]:
        out.append(f"recipe: {saved['recipe']} -> {this['recipe']}")
    old_model, new_model = saved.get("model") or {}, this.get("model") or {}
    for field in ("hf_model_id", *ARCHITECTURE_FIELDS):
        if field in old_model and field in new_model and old_model[field] != new_model[field]:
            out.append(f"model.{field}: {old_model[field]} -> {new_model[field]}")
    if "start" in saved and "start" in this and _start_differs(saved["start"], this["start"]):
        out.append(f"starting weights: {start_words(saved['start'])} -> {start_words(this['start'])}")
    if "data" in saved and "data" in this:
        old, new = saved["data"] or {}, this["data"] or {}
        same = (
            old.get("rows_sha256") == new.get("rows_sha256")
            if old.get("rows_sha256") and new.get("rows_sha256")
            else (old.get("kind"), old.get("path")) == (new.get("kind"), new.get("path"))
        )
        if not same:
            out.append(f"data: {_data_words(old)} -> {_data_words(new)}")
    if "seq_length" in saved and "seq_length" in this and saved["seq_length"] != this["seq_length"]:
        out.append(f"sequence length: {saved['seq_length']} -> {this['seq_length']}")
    if "lora" in saved and "lora" in this and _lora_differs(saved["lora"], this["lora"]):
        out.append(f"LoRA: {lora_words(saved['lora'])} -> {lora_words(this['lora'])}")
    return out


def saved_identity(folder: str | Path) -> tuple[int, dict, bool] | None:
    """(iteration, identity, complete) of the newest checkpoint in ``folder``, or None when it holds none:
    the identity the launch wrote (complete), else what the checkpoint's run_config.yaml tells."""
    latest = latest_run_config(folder)
    if latest is None:
        return None
    iteration, run_config = latest
    written = read_identity(Path(folder).parent if iteration_of(folder) is not None else folder)
    if written is not None:
        return iteration, written, True
    return iteration, identity_of_run_config(run_config), False


def fresh_folder(save: str | Path) -> Path:
    """Where ``--fresh`` starts a new run saved under ``save``: ``save`` itself when it holds no
    checkpoint, else ``save/fresh_<N>`` for the first N whose path does not exist (nothing is moved,
    deleted or written over)."""
    save = Path(save)
    if not holds_checkpoint(save):
        return save
    n = 1
    while (save / f"{FRESH_PREFIX}{n}").exists():
        n += 1
    return save / f"{FRESH_PREFIX}{n}"


def fresh_runs(save: str | Path) -> list[Path]:
    """The runs ``--fresh`` started under ``save`` that hold a checkpoint, oldest first."""
    save = Path(save)
    if not save.is_dir():
        return []
    found = [p for p in save.glob(f"{FRESH_PREFIX}*") if p.name[len(FRESH_PREFIX) :].isdigit()]
    return [
        p for p in sorted(found, key=lambda p: int(p.name[len(FRESH_PREFIX) :])) if latest_iteration(p) is not None
    ]
