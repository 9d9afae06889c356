"""What a Megatron-Bridge checkpoint folder says about the run that saved it.

A run's ``checkpoint.save`` folder holds ``latest_checkpointed_iteration.txt`` (the newest
iteration, as digits) and one ``iter_NNNNNNN`` folder per save, each with the run's finalized
config as ``run_config.yaml``. The runner's resume checks read the saved layout from it, and the
Hugging Face export reads whether the run trained LoRA adapters (``peft``) and their settings.
"""

from __future__ import annotations

from pathlib import Path

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
