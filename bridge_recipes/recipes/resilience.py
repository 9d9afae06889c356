"""Resilience defaults of the real-data recipes (the benchmark recipes turn them off).

What Megatron-Bridge and nvidia-resiliency-ext (NVRx) already provide, switched on:
- periodic torch_dist checkpoints (about ten a run: :mod:`bridge_recipes.config.save_interval`), saved
  asynchronously by a persistent worker (torch_dist is the format Megatron-Core supports async
  saving for), and automatic resume: ``checkpoint.load``
  is the save folder, so a restarted job continues from the latest checkpoint there when one
  exists, and starts fresh when none does;
- NVRx fault tolerance: heartbeat and section timeouts (computed from the run itself,
  ``calc_ft_timeouts``) watched by the rank monitors that ``ft_launcher`` starts; without
  ``ft_launcher`` the runner turns it off at launch with one log line;
- NVRx straggler detection: relative and individual GPU performance scores reported every
  5 minutes (reporting only; ``nvrx_straggler.stop_if_detected=true`` stops the job);
- in-process restart: configured with Megatron-Bridge's timeouts but off
  (``inprocess_restart.enabled=true`` turns it on); it restarts the training function inside
  the same processes after a fault and needs the job to own its process groups.
"""

from __future__ import annotations

# The real-data recipes' checkpoint interval in steps, the longest a run gets: unless one is given, the
# builder shortens it to the run's length and expected time (bridge_recipes.config.save_interval).
SAVE_INTERVAL_STEPS = 100


def enable_resilience(cfg, save_interval: int = SAVE_INTERVAL_STEPS) -> None:
    from megatron.bridge.training.config import (
        FaultToleranceConfig,
        InProcessRestartConfig,
        NVRxStragglerDetectionConfig,
    )

    c = cfg.checkpoint
    c.ckpt_format = "torch_dist"
    c.save_interval = save_interval
    c.load = c.save  # resume from the latest checkpoint in the save folder, when there is one
    c.async_save = True
    c.use_persistent_ckpt_worker = True  # async_save needs it
    c.fully_parallel_save = True
    cfg.ft = FaultToleranceConfig(enable_ft_package=True, calc_ft_timeouts=True)
    cfg.nvrx_straggler = NVRxStragglerDetectionConfig(enabled=True, report_time_interval=300.0, stop_if_detected=False)
    cfg.inprocess_restart = InProcessRestartConfig(enabled=False)


def disable_resilience(cfg) -> None:
    """Benchmarks: no checkpoints, no monitors (they would perturb the timing)."""
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.checkpoint.async_save = False
    cfg.ft = None
    cfg.nvrx_straggler = None
    cfg.inprocess_restart = None


def launched_by_ft_launcher(environ=None) -> bool:
    """ft_launcher's rank monitors publish their socket to each rank in this variable."""
    import os

    return "FT_RANK_MONITOR_IPC_SOCKET" in (os.environ if environ is None else environ)
