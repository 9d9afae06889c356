"""The parallel layout of a config on a world size: one definition of each layout rule.

Used by the runner's layout checks, the memory planner, the result files, the checkpoint
checks and the scale-down: the parallel sizes, the data-parallel size the world size leaves,
the layers each pipeline stage holds, and Megatron-Core's rule that an unset expert tensor
parallel size follows TP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int | None
    vpp: int | None
    dp: int | None  # None when the world size is not divisible by TP x PP x CP
    world: int
    sp: bool = False  # sequence parallelism (splits the residual stream over TP)
    moe: bool = True  # the model has routed experts (EP and ETP mean something)

    @property
    def model_parallel(self) -> int:
        """GPUs one model replica spans: TP x PP x CP."""
        return self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Megatron-Core: an unset expert tensor parallel size follows TP."""
        return self.tp if self.etp is None else self.etp

    @property
    def dense_dp(self) -> int:
        """Group the distributed optimizer shards dense parameters over (DP x CP)."""
        return self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """Expert-data-parallel group: world / (PP x EP x ETP)."""
        return self.world // (self.pp * self.ep * self.expert_tp)

    def label(self, show_sp: bool = False) -> str:
        """``TP1 PP4 DP2``-style label; ``show_sp`` marks sequence parallelism after TP."""
        parts = [f"TP{self.tp}" + (" SP" if show_sp and self.sp else ""), f"PP{self.pp}"]
        if self.vpp:
            parts.append(f"VPP{self.vpp}")
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.moe and (self.ep > 1 or self.expert_tp != self.tp):  # experts split otherwise than dense layers
            parts.append(f"EP{self.ep}")
            parts.append(f"ETP{self.expert_tp}")
        parts.append(f"DP{self.dp if self.dp is not None else '?'}")
        return " ".join(parts)


def layout_of(cfg: Any, world_size: int) -> Layout:
    """The layout of ``cfg`` (a ConfigContainer, or any object with its ``model`` fields) on
    ``world_size`` GPUs; unset sizes count as 1 (expert TP stays unset: see ``expert_tp``)."""
    m = cfg.model
    tp, pp, cp = _model_parallel_sizes(m)
    mp = tp * pp * cp
    return Layout(
        tp=tp,
        pp=pp,
        cp=cp,
        ep=getattr(m, "expert_model_parallel_size", 1) or 1,
        etp=getattr(m, "expert_tensor_parallel_size", None),
        vpp=getattr(m, "virtual_pipeline_model_parallel_size", None),
        dp=world_size // mp if world_size % mp == 0 else None,
        world=world_size,
        sp=bool(getattr(m, "sequence_parallel", False)),
        moe=bool(getattr(m, "num_moe_experts", None)),
    )


def _model_parallel_sizes(model: Any) -> tuple[int, int, int]:
    """(TP, PP, CP) of a model config; unset counts as 1."""
    return tuple(
        getattr(model, key, None) or 1
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
    )


def stage_layers(cfg: Any) -> list[int] | None:
    """Decoder layers per pipeline stage, or None when they cannot be split."""
    m = cfg.model
    pp, n = m.pipeline_model_parallel_size, m.num_layers
    first = getattr(m, "num_layers_in_first_pipeline_stage", None)
    last = getattr(m, "num_layers_in_last_pipeline_stage", None)
    if pp == 1:
        return [n]
    middle_stages = pp - (first is not None) - (last is not None)
    rest = n - (first or 0) - (last or 0)
    if rest < 0 or (middle_stages == 0 and rest != 0) or (middle_stages and rest % middle_stages):
        return None
    mid = [rest // middle_stages] * middle_stages if middle_stages else []
    return ([first] if first is not None else []) + mid + ([last] if last is not None else [])
