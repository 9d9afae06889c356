"""What a Megatron-Bridge checkpoint folder says about the run that saved it.

A run's ``checkpoint.save`` folder holds ``latest_checkpointed_iteration.txt`` (the newest
iteration, as digits) and one ``iter_NNNNNNN`` folder per save, each with the run's finalized
config as ``run_config.yaml``. The runner's resume checks read the saved layout from it, and the
Hugging Face export reads whether the run trained LoRA adapters (``peft``) and their settings.
The launch also writes ``run_identity.json`` there (:func:`run_identity`): what the run is, so that
a later run of another recipe, model, data, sequence length or LoRA setting is refused rather than
resumed from it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TRACKER = "latest_checkpointed_iteration.txt"
RUN_CONFIG = "run_config.yaml"


class CheckpointMetadataError(ValueError):
    """A checkpoint folder whose metadata cannot be read; the message names the file."""


def iteration_folder(folder: str | Path, iteration: int) -> Path:
    return Path(folder) / f"iter_{iteration:07d}"


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
    ({}) when that iteration has no run_config.yaml."""
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
# model's architecture, the data (a rows folder by its content hash), the sequence length and the
# LoRA settings; the parallel layout, the step count and the learning rate are not: they may change
# between a run and its resumption.

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


def run_identity(cfg: Any, recipe: str) -> dict:
    """What identifies the run ``cfg`` of recipe ``recipe`` (see :data:`IDENTITY`)."""
    m = cfg.model
    return {
        "recipe": recipe,
        "model": {
            "hf_model_id": getattr(m, "hf_model_id", None),
            **{f: getattr(m, f, None) for f in ARCHITECTURE_FIELDS},
        },
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
    from bridge_recipes.outputs import write_text_atomic

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


def _lora_words(lora: dict | None) -> str:
    if lora is None:
        return "full fine-tuning (no LoRA)"
    targets = ", ".join(lora.get("target_modules") or []) or "no targets"
    return (
        f"{lora.get('scheme', 'LoRA')} rank {lora.get('dim')} alpha {lora.get('alpha')} "
        f"dropout {lora.get('dropout')} on {targets}"
    )


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
        out.append(f"LoRA: {_lora_words(saved['lora'])} -> {_lora_words(this['lora'])}")
    return out


def saved_identity(folder: str | Path) -> tuple[int, dict, bool] | None:
    """(iteration, identity, complete) of the newest checkpoint in ``folder``, or None when it holds none:
    the identity the launch wrote (complete), else what the checkpoint's run_config.yaml tells."""
    latest = latest_run_config(folder)
    if latest is None:
        return None
    iteration, run_config = latest
    written = read_identity(folder)
    if written is not None:
        return iteration, written, True
    return iteration, identity_of_run_config(run_config), False


def fresh_folder(save: str | Path) -> Path:
    """Where ``--fresh`` starts a new run saved under ``save``: ``save`` itself when it holds no
    checkpoint, else ``save/fresh_<N>`` for the first N whose path does not exist (nothing is moved,
    deleted or written over)."""
    save = Path(save)
    if latest_iteration(save) is None:
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
