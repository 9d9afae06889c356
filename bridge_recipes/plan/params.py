"""Parameters per rank: each module's count (``bridge_recipes.models.params``, the one definition) split
by the parallel layout. Attention / GDN / dense-MLP / shared-expert matrices and the vocabulary are
divided by TP, norms and the MoE router are replicated, routed experts are divided by EP and then
ETP; LoRA adapters are counted on the linears they target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge_recipes.models import params as counts
from bridge_recipes.models.dims import ModelDims
from bridge_recipes.plan.layout import Layout

ONE_RANK = Layout(tp=1, pp=1, cp=1, ep=1, etp=1, vpp=None, dp=1, world=1)  # the whole model on one GPU


@dataclass(frozen=True)
class Params:
    dense: float = 0.0  # sharded by the optimizer over DP x CP
    expert: float = 0.0  # sharded over the expert-data-parallel group

    def __add__(self, other: Params) -> Params:
        return Params(self.dense + other.dense, self.expert + other.expert)

    @property
    def total(self) -> float:
        return self.dense + self.expert

    @classmethod
    def on_rank(cls, m: counts.ModuleParams, par: Layout) -> Params:
        """What one rank holds of module ``m``."""
        return cls(dense=m.split / par.tp + m.replicated, expert=m.experts / par.ep * m.expert / par.expert_tp)


def layer_params(d: ModelDims, par: Layout, index: int) -> Params:
    return Params.on_rank(counts.mixer_params(d, index), par) + Params.on_rank(counts.mlp_params(d, index), par)


def padded_vocab(d: ModelDims, par: Layout) -> int:
    return counts.padded_vocab(d, par.tp)


def mtp_params(d: ModelDims, par: Layout) -> Params:
    """One MTP layer (:func:`bridge_recipes.models.params.mtp_layer_params`)."""
    own, attention, mlp = (Params.on_rank(m, par) for m in counts.mtp_layer_params(d))
    return own + attention + mlp


def mtp_layers_params(d: ModelDims, par: Layout) -> Params:
    """All the MTP layers."""
    mtp = mtp_params(d, par)
    return Params(mtp.dense * d.mtp_layers, mtp.expert * d.mtp_layers)


def stage_params(d: ModelDims, par: Layout, layers: list[int], stage: int) -> Params:
    p = Params()
    for i in layers:
        p = p + layer_params(d, par, i)
    embedding = Params.on_rank(counts.embedding_params(d, par.tp), par)
    if stage == 0:
        p = p + embedding
    elif stage == par.pp - 1 and d.mtp_layers:
        # Megatron-Core builds an embedding on every stage that runs MTP (GPTModel: pre_process
        # or mtp_process), its gradients tied to the first stage's: a trained copy with its own
        # gradients and optimizer state
        p = p + embedding
    if stage == par.pp - 1:
        output = counts.output_params(d, par.tp, tied=d.tied_embeddings and par.pp == 1)
        p = p + Params.on_rank(output, par) + mtp_layers_params(d, par)
    return p


def lora_targets(cfg: Any) -> tuple[frozenset[str], int] | None:
    """The module names and rank of a LoRA ``cfg.peft`` (None without one)."""
    peft = getattr(cfg, "peft", None)
    if peft is None:
        return None
    return frozenset(peft.target_modules or ()), int(peft.dim)


def layer_linears(d: ModelDims, par: Layout, gdn: bool, moe: bool) -> list[tuple[str, int, int, int]]:
    """(module name, local input, local output, how many a rank holds) of a decoder layer's linears, its
    mixer (Gated DeltaNet or attention) and its MLP (routed experts and shared expert, or dense):
    column-parallel ones split their output by TP, row-parallel ones their input; the routed experts'
    two matrices, split by ETP, count once per expert on the rank (Transformer Engine's grouped linear
    keeps one weight per expert)."""
    glu = 2 if d.gated_linear_unit else 1
    if gdn:
        qkvz = 2 * d.gdn_qk + 2 * d.gdn_v + 2 * d.gdn_value_heads
        out = [("in_proj", d.hidden, qkvz // par.tp, 1), ("out_proj", d.gdn_v // par.tp, d.hidden, 1)]
    else:
        qkv = d.q_dim * (2 if d.output_gate else 1) + 2 * d.kv_dim
        out = [("linear_qkv", d.hidden, qkv // par.tp, 1), ("linear_proj", d.q_dim // par.tp, d.hidden, 1)]
    mlps = (
        ((d.moe_ffn, par.expert_tp, d.experts // par.ep), (d.shared_ffn, par.tp, 1)) if moe else ((d.ffn, par.tp, 1),)
    )
    for ffn, tp, count in mlps:
        if ffn:
            out += [("linear_fc1", d.hidden, glu * ffn // tp, count), ("linear_fc2", ffn // tp, d.hidden, count)]
    return out


def lora_params(d: ModelDims, par: Layout, layers: list[int], targets: frozenset[str], dim: int) -> float:
    """Adapter parameters a rank holds for ``layers`` (trained; the base stays frozen): one adapter per
    targeted linear, the routed experts' shared by all the rank's experts."""
    return sum(
        dim * (n + m) for i in layers for name, n, m, _ in layer_linears(d, par, *d.layer_kinds(i)) if name in targets
    )


# How many Hugging Face modules a fused Megatron linear is, each saved with its own copy of the one A.
_HF_PARTS = {"linear_qkv": 3, "in_proj": 4}


def adapter_folder_params(d: ModelDims, layers: list[int], targets: frozenset[str], dim: int) -> float:
    """Parameters of the adapter-only export of ``layers`` (the PEFT folder, one GPU's layout): a fused
    projection's A once per Hugging Face module it becomes (q/k/v, the Gated DeltaNet's four inputs,
    a dense or shared expert's gate and up), and the experts' shared adapter once per expert, as the
    stacked adapters PEFT and vLLM read (gate and up of an expert share one A there)."""
    total = 0.0
    for i in layers:
        for name, n, m, count in layer_linears(d, ONE_RANK, *d.layer_kinds(i)):
            if name in targets:
                parts = _HF_PARTS.get(name, 2 if name == "linear_fc1" and count == 1 else 1)
                total += dim * (parts * n + m) * count
    return total


def linear_params(d: ModelDims, par: Layout, layers: list[int]) -> float:
    """The decoder layers' linear weights a rank holds (what Transformer Engine's linears keep)."""
    return sum(n * m * count for i in layers for _, n, m, count in layer_linears(d, par, *d.layer_kinds(i)))


def mtp_linear_params(d: ModelDims, par: Layout) -> float:
    """The MTP layers' linear weights: each one's 2h -> h projection, its attention and its MLP."""
    own = 2 * d.hidden * d.hidden / par.tp
    return d.mtp_layers * (own + sum(n * m * c for _, n, m, c in layer_linears(d, par, False, bool(d.experts))))
