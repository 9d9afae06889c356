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


# --- the layout rules -----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What the layout rules read of a model: the head counts TP splits, the routed experts EP
    splits, the sequence CP and SP split."""

    heads: tuple[tuple[str, int], ...]
    experts: int | None
    seq_length: int


def model_shape(model: Any, num_experts: int | None = None) -> ModelShape:
    """``model``'s shape (``num_experts`` in place of its own, for a scaled-down model)."""
    heads = (
        ("attention heads", model.num_attention_heads),
        ("KV heads (num_query_groups)", model.num_query_groups),
        ("GDN key heads", getattr(model, "linear_num_key_heads", None)),
        ("GDN value heads", getattr(model, "linear_num_value_heads", None)),
    )
    return ModelShape(
        heads=tuple((what, n) for what, n in heads if n),
        experts=num_experts or getattr(model, "num_moe_experts", None),
        seq_length=model.seq_length,
    )


def divides(a: int, b: int) -> bool:
    return b > 0 and a % b == 0


def rule_problems(shape: ModelShape, lay: Layout, stages: list[int] | None) -> list[str]:
    """Every layout rule ``lay`` breaks for a model of ``shape`` with ``stages`` layers per
    pipeline stage, one message each (naming the sizes and the fix); empty when it is valid.
    Megatron-Core's rules: TP x PP x CP divides the world; VPP needs PP > 1 and divides every
    stage; TP divides every head count; EP divides the experts and EP x ETP the GPUs of a stage
    (TP x CP x DP); CP divides the sequence in 2 x CP load-balanced chunks; sequence parallelism
    divides each CP rank's tokens over TP, and MoE with TP > 1 needs it."""
    out = []
    if lay.dp is None:
        out.append(
            f"world size {lay.world} is not divisible by TP x PP x CP = {lay.tp} x {lay.pp} x {lay.cp} = "
            f"{lay.model_parallel}; launch a multiple of {lay.model_parallel} GPUs or change -tp/-pp/-cp"
        )
    if lay.vpp:
        if lay.pp == 1:
            out.append("virtual pipeline stages need PP > 1: unset -vp or raise -pp")
        elif stages is not None and any(s % lay.vpp for s in stages):
            out.append(
                f"layers per stage {stages} are not divisible by VPP={lay.vpp}; choose -vp dividing every stage"
            )
    for what, n in shape.heads:
        if not divides(n, lay.tp):
            out.append(f"{what} = {n} is not divisible by TP={lay.tp}; use -tp dividing {n}")
    if shape.experts:
        if not divides(shape.experts, lay.ep):
            out.append(f"{shape.experts} experts are not divisible by EP={lay.ep}; use -ep dividing {shape.experts}")
        if lay.dp is not None and not divides(lay.tp * lay.cp * lay.dp, lay.ep * lay.expert_tp):
            out.append(
                f"EP x ETP = {lay.ep} x {lay.expert_tp} must divide TP x CP x DP = {lay.tp} x {lay.cp} x {lay.dp} "
                f"(the GPUs of one pipeline stage); lower -ep/-etp or raise the data-parallel size"
            )
    elif lay.ep > 1:
        out.append(f"EP={lay.ep} on a dense model: set -ep 1")
    seq = shape.seq_length
    if lay.cp > 1 and not divides(seq, 2 * lay.cp):
        out.append(
            f"sequence length {seq} is not divisible by 2 x CP = {2 * lay.cp} (load-balanced context parallelism)"
        )
    if lay.sp and lay.tp > 1 and not divides(seq // lay.cp, lay.tp):
        out.append(
            f"sequence length per CP rank {seq // lay.cp} is not divisible by TP={lay.tp} under sequence parallelism"
        )
    if lay.tp > 1 and shape.experts and not lay.sp:
        out.append(
            "TP > 1 with MoE needs sequence parallelism (Megatron-Core requires it); set model.sequence_parallel=true"
        )
    return out
