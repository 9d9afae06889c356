"""Logits parity of an imported checkpoint loaded at another parallel layout (two GPUs).

    torchrun --nproc-per-node 2 -m bridge_recipes.hf.parity_mp MEGATRON HF_DIR OUT.json \
        --tp 2 [--ep 1] [--routing dense|all_experts] --name NAME

Every rank loads the one-GPU import at ``--tp`` / ``--ep`` (Megatron's distributed checkpoint
reshards the weights; sequence parallelism on with TP, as MoE needs) and runs the same tokens
(:func:`bridge_recipes.hf.parity.parity_tokens`); the vocabulary-parallel logits are gathered over
TP, and rank 0 compares them with transformers' (FP32, one GPU) and writes the case (the fields of
:func:`bridge_recipes.hf.parity.parity_cases`' cases) to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("megatron", help="the one-GPU import (convert_checkpoint.py import --out)")
    p.add_argument("hf_dir", help="the Hugging Face folder it was imported from")
    p.add_argument("out", help="JSON file for the case (rank 0)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--routing", choices=("dense", "all_experts"), default="dense")
    p.add_argument("--name", required=True)
    return p


def layout_problem(tp: int, ep: int, world: int) -> str | None:
    """Why ``--tp``/``--ep`` cannot run on ``world`` ranks (one model replica: TP x DP = world, EP
    dividing it), or None."""
    if tp < 1 or ep < 1:
        return f"--tp {tp} --ep {ep}: sizes start at 1"
    if world % tp or world % ep:
        return f"--tp {tp} --ep {ep} do not divide the {world} ranks torchrun started"
    return None


def case(name: str, kind: str, routing: str, tp: int, ep: int, world: int, compared: dict[str, float]) -> dict:
    """One parity case, shaped as the one-GPU arm's (gated like them: FP32, dense or every expert)."""
    return {
        "name": f"{name}_fp32_{routing}",
        "model": kind,
        "dtype": "fp32",
        "routing": routing,
        "layout": f"TP{tp} EP{ep} ({world} GPUs), loaded from the one-GPU import",
        **compared,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    problem = layout_problem(args.tp, args.ep, world)
    if problem:
        print(f"parity_mp: {problem}", file=sys.stderr)
        return 2
    import megatron.bridge  # noqa: F401  (first: see bridge_recipes.hf.parity)
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    from bridge_recipes.hf import parity

    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=args.tp, expert_model_parallel_size=args.ep)
    model_parallel_cuda_manual_seed(0)
    config = json.loads((Path(args.hf_dir) / "config.json").read_text())
    experts = (config.get("text_config") or config).get("num_experts")
    kind = "moe" if experts else "dense"
    topk = experts if args.routing == "all_experts" else None
    tokens = parity.parity_tokens()
    mg = parity.load_megatron(
        args.megatron,
        args.hf_dir,
        topk=topk,
        extra={
            "tensor_model_parallel_size": args.tp,
            "expert_model_parallel_size": args.ep,
            "expert_tensor_parallel_size": 1,
            "sequence_parallel": args.tp > 1,
        },
    )
    logits: Any = parity.megatron_logits(mg, tokens)
    if args.tp > 1:
        logits = gather_from_tensor_model_parallel_region(logits.contiguous())
    del mg
    if rank == 0:
        hf = parity.load_hf(args.hf_dir, topk=topk)
        compared = parity.compare_logits(parity.hf_logits(hf, tokens), logits)
        result = case(args.name, kind, args.routing, args.tp, args.ep, world, compared)
        Path(args.out).write_text(json.dumps(result) + "\n")
        print(parity.log_line(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
