"""Where a run's logs go: TensorBoard beside the save folder, Weights & Biases when asked for.

Applied by :func:`bridge_recipes.build` after the flags and overrides:

- TensorBoard. A recipe writes checkpoints to ``<run>/checkpoints`` and TensorBoard events to
  ``<run>/tb`` (``bridge_recipes.recipes.base.run_dir``). When the save folder moves
  (``--save-dir`` or ``checkpoint.save=``) and the TensorBoard folder was laid out beside the old
  one (``<run>/tb``, or ``<save>/tensorboard`` from an earlier move, as a saved config file
  holds it; a recipe that does not save keeps its ``experiments/<run>/tb``), it moves to
  ``<new save>/tensorboard``: inside the save folder, so two runs saved to
  different folders never share one. A ``logger.tensorboard_dir=`` override wins, and a folder
  set anywhere else stays where it is.
- Weights & Biases. With ``logger.wandb_project`` set (``--wandb-project NAME`` or the override),
  the experiment name defaults to the recipe's name and the local W&B folder to
  ``<save>/wandb`` (Megatron-Bridge's own default, written out so the YAML shows it; it follows
  the save folder like TensorBoard). The ``wandb`` package is an optional extra
  (``pip install -e .[wandb]``): without it the build fails with the fix, before any launch.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import Any

TENSORBOARD = "tensorboard"  # <save>/tensorboard once the save folder moves
WANDB = "wandb"  # <save>/wandb: Megatron-Bridge's default W&B folder


def _beside(path: str | None, save: str | None) -> bool:
    """Whether ``path`` is laid out beside save folder ``save`` (``<run>/tb`` or ``<save>/tensorboard``),
    or is a recipe's own ``experiments/<run>/tb`` (a recipe that does not save, such as the smoke one)."""
    if not path:
        return False
    path = os.path.normpath(path)
    if os.path.basename(path) == "tb" and os.path.basename(os.path.dirname(os.path.dirname(path))) == "experiments":
        return True
    if not save:
        return False
    save = os.path.normpath(save)
    return path in (os.path.join(os.path.dirname(save), "tb"), os.path.join(save, TENSORBOARD))


def snapshot(cfg: Any) -> dict[str, Any]:
    """What :func:`follow_save` compares with: the save folder and log folders before the overrides."""
    return {
        "save": cfg.checkpoint.save,
        "tensorboard_dir": cfg.logger.tensorboard_dir,
        "wandb_save_dir": cfg.logger.wandb_save_dir,
    }


def follow_save(cfg: Any, before: dict[str, Any], set_keys: Iterable[str], recipe: str) -> None:
    """Move the log folders after a moved save folder and fill in the W&B defaults (see the module)."""
    set_keys = set(set_keys)
    log, save = cfg.logger, cfg.checkpoint.save
    moved = save and save != before["save"]
    if moved and "logger.tensorboard_dir" not in set_keys and _beside(log.tensorboard_dir, before["save"]):
        log.tensorboard_dir = os.path.join(save, TENSORBOARD)
    if not log.wandb_project:
        return
    if not log.wandb_exp_name:
        log.wandb_exp_name = recipe
    old = before["wandb_save_dir"]
    follows = old is None or (
        before["save"] and os.path.normpath(old) == os.path.normpath(os.path.join(before["save"], WANDB))
    )
    if save and "logger.wandb_save_dir" not in set_keys and follows:
        log.wandb_save_dir = os.path.join(save, WANDB)


def problem(cfg: Any) -> str | None:
    """Why the config's experiment tracking cannot start here, or None."""
    if cfg.logger.wandb_project and importlib.util.find_spec("wandb") is None:
        return (
            f"logger.wandb_project={cfg.logger.wandb_project!r} logs to Weights & Biases, but the wandb package "
            "is not installed; install the extra (.venv/bin/pip install -e '.[wandb]') or drop --wandb-project"
        )
    return None
