"""The pipeline schedule: which decoder layers each stage (and model chunk) runs, and how many micro
batches' activations a stage holds at once."""

from __future__ import annotations

from typing import Any

from bridge_recipes.plan.layout import Layout, stage_layers


def stage_chunks(cfg: Any, par: Layout) -> list[list[list[int]]]:
    """Global decoder-layer indices per stage, split into model chunks (one without VPP).
    With VPP and no uneven first/last stage, chunk c of stage r is Megatron's interleaved
    assignment; with uneven stages the stage's own layers are split in VPP parts."""

    counts = stage_layers(cfg)
    if counts is None:
        raise ValueError("the layers do not split over the pipeline stages (see the layout checks)")
    vpp = par.vpp or 1
    m = cfg.model
    if vpp > 1 and m.num_layers_in_first_pipeline_stage is None and m.num_layers_in_last_pipeline_stage is None:
        size = m.num_layers // (par.pp * vpp)
        return [
            [list(range((c * par.pp + r) * size, (c * par.pp + r + 1) * size)) for c in range(vpp)]
            for r in range(par.pp)
        ]
    starts = [sum(counts[:r]) for r in range(par.pp)]
    stages = [list(range(s, s + n)) for s, n in zip(starts, counts)]
    return [[layers[c * len(layers) // vpp : (c + 1) * len(layers) // vpp] for c in range(vpp)] for layers in stages]


def num_microbatches(cfg: Any, par: Layout) -> int:
    return max(1, cfg.train.global_batch_size // (cfg.train.micro_batch_size * par.dp))


def micro_batches_in_flight(stage: int, par: Layout, microbatches: int) -> float:
    """Micro batches whose activations a stage holds at once (1F1B: the warm-up forwards plus
    one; interleaved: Megatron's warm-up count of model chunks plus one, in micro batches)."""
    if not par.vpp or par.vpp == 1:
        return min(par.pp - stage, microbatches)
    chunks = (par.pp - stage - 1) * 2 + (par.vpp - 1) * par.pp + 1
    return min(chunks, microbatches * par.vpp) / par.vpp
