"""Logits parity between Megatron and transformers for converted checkpoints, and its gates.

The gates (:data:`TOP1_MIN`, :data:`REL_ERR_MAX`) hold for the cases where both sides compute
the same function exactly up to rounding: FP32, and either a dense model or a MoE model with
every expert routed (top-k = number of experts), so that no token's expert choice can flip on
a rounding difference between the two routers. BF16 cases and real top-k routing are reported
beside them without a gate: a near-tie in the router then picks a different expert on one side
(``expert_set_differs_share``: the share of (token, MoE layer) pairs whose chosen expert sets
differ), which moves that token's logits by far more than rounding.

GPU-side functions import Megatron-Bridge first: imported after cuDNN has been used in the
process, its Transformer Engine attention fails to initialize.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

TOP1_MIN = 0.999
REL_ERR_MAX = 5e-3
GATED_DTYPE = "fp32"
GATED_ROUTINGS = ("dense", "all_experts")
CASE_FIELDS = ("model", "dtype", "routing", "layout", "top1", "rel_err")
LOG_PREFIX = "[hf-parity] case "


def gated(case: dict) -> bool:
    return case["dtype"] == GATED_DTYPE and case["routing"] in GATED_ROUTINGS


def gate_failures(cases: list[dict]) -> list[str]:
    """One line per case that misses its gate or lacks a field; empty when every gate holds."""
    out = []
    for c in cases:
        missing = [f for f in CASE_FIELDS if f not in c]
        if c.get("model") == "moe" and c.get("routing") == "topk" and "expert_set_differs_share" not in c:
            missing.append("expert_set_differs_share")
        if missing:
            out.append(f"case {c.get('name', c)} lacks {', '.join(missing)}")
            continue
        if gated(c) and not (c["top1"] >= TOP1_MIN and c["rel_err"] <= REL_ERR_MAX):
            out.append(
                f"case {c.get('name')}: top1 {c['top1']:.4f} (>= {TOP1_MIN}) rel_err {c['rel_err']:.2e} "
                f"(<= {REL_ERR_MAX:g}) fails the gate"
            )
    if not any(gated(c) and c.get("model") == "dense" for c in cases):
        out.append("no gated dense case")
    if not any(gated(c) and c.get("model") == "moe" for c in cases):
        out.append("no gated MoE case (FP32, every expert routed)")
    return out


def log_line(case: dict) -> str:
    return LOG_PREFIX + json.dumps(case, sort_keys=True)


def cases_in_log(text: str) -> list[dict]:
    """The cases a driver log records (one ``[hf-parity] case {json}`` line each)."""
    return [json.loads(m.group(1)) for m in re.finditer(re.escape(LOG_PREFIX) + r"(\{.*\})", text)]


# --------------------------------------------------------------------------- GPU side


def compare_logits(ref: Any, got: Any) -> dict[str, float]:
    """top-1 agreement and ||got - ref|| / ||ref|| over every position (``ref``: transformers)."""
    ref, got = ref.float(), got.float()[..., : ref.shape[-1]]
    top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    rel = ((got - ref).norm() / ref.norm()).item()
    return {"top1": round(top1, 6), "rel_err": float(f"{rel:.4e}")}


def init_single_gpu() -> None:
    """A one-process NCCL group and Megatron's model-parallel state (all sizes 1) on GPU 0."""
    import socket

    import megatron.bridge  # noqa: F401  (first: see the module docstring)
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)


def _unwrap(module: Any) -> Any:
    while hasattr(module, "module"):
        module = module.module
    return module


# Parity tokens (ids below the toy tokenizer's 1,024): 8 x 512 = 4,096 positions, so that the
# top-1 gate of 0.999 is a rate (4 disagreements allowed), not "none at all".
BATCH, SEQ = 8, 512


def parity_tokens() -> Any:
    """The token ids every parity case runs, the same on every GPU and process (seed 0)."""
    import torch

    torch.manual_seed(0)
    return torch.randint(3, 1024, (BATCH, SEQ), device="cuda")


def load_megatron(
    checkpoint: str | Path, hf_dir: str | Path, *, topk: int | None = None, extra: dict[str, Any] | None = None
) -> Any:
    """The newest iter of a Megatron checkpoint on the GPU in FP32, eval mode (``topk``: router
    override; ``extra``: more model overrides, e.g. the parallel sizes to load it at)."""
    import torch
    from megatron.bridge import AutoBridge

    overrides: dict[str, Any] = {"gradient_accumulation_fusion": False, **(extra or {})}
    if topk is not None:
        overrides["moe_router_topk"] = topk
    bridge = AutoBridge.from_hf_pretrained(str(hf_dir))
    models = bridge.load_megatron_model(str(checkpoint), mp_overrides=overrides, wrap_with_ddp=False)
    return _unwrap(models[0]).to(torch.float32).cuda().eval()


def load_hf(hf_dir: str | Path, *, topk: int | None = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    kw = {"num_experts_per_tok": topk} if topk is not None else {}
    return AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, **kw).cuda().eval()


def megatron_logits(model: Any, tokens: Any) -> Any:
    import torch

    b, s = tokens.shape
    pos = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, -1)
    with torch.no_grad():
        return model(input_ids=tokens, position_ids=pos, attention_mask=None).float()


def hf_logits(model: Any, tokens: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


class RouteRecorder:
    """Expert choices per MoE layer: transformers' routers (indices) and Megatron's (routing maps)."""

    def __init__(self, hf_model: Any, mg_model: Any, batch: int, seq: int):
        from megatron.core.transformer.moe.router import TopKRouter

        self.hf, self.mg, self.handles, self.b, self.s = [], [], [], batch, seq
        for m in hf_model.modules():
            if type(m).__name__.endswith("TopKRouter"):
                self.handles.append(m.register_forward_hook(lambda mod, i, o: self.hf.append(o[2].detach())))
        for m in mg_model.modules():
            if isinstance(m, TopKRouter):
                self.handles.append(m.register_forward_hook(lambda mod, i, o: self.mg.append(o[1].detach())))

    def differs_share(self, num_experts: int) -> float:
        """Share of (token, layer) pairs whose expert sets differ between the two sides."""
        import torch

        shares = []
        for idx, routing_map in zip(self.hf, self.mg):
            hf_map = torch.zeros(idx.shape[0], num_experts, dtype=torch.bool, device=idx.device)
            hf_map.scatter_(1, idx.long(), True)
            # Megatron's tokens are sequence-major ([s, b]); transformers' batch-major ([b, s]).
            mg_map = routing_map.view(self.s, self.b, -1).transpose(0, 1).reshape(self.b * self.s, -1).bool()
            shares.append((hf_map != mg_map).any(-1).float().mean().item())
        return round(sum(shares) / len(shares), 6) if shares else float("nan")

    def clear(self) -> None:
        self.hf.clear()
        self.mg.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def parity_cases(
    name: str, kind: str, megatron_ckpt: str | Path, hf_dir: str | Path, tokens: Any, *, routings: list[str]
) -> list[dict]:
    """FP32 then BF16 cases of one converted pair, for each routing (dense | all_experts | topk)."""
    import torch

    config = json.loads((Path(hf_dir) / "config.json").read_text())
    text = config.get("text_config") or config
    experts = text.get("num_experts")
    out = []
    for routing in routings:
        topk = experts if routing == "all_experts" else None
        mg, hf = load_megatron(megatron_ckpt, hf_dir, topk=topk), load_hf(hf_dir, topk=topk)
        rec = RouteRecorder(hf, mg, *tokens.shape) if routing == "topk" else None
        for dtype in ("fp32", "bf16"):
            if dtype == "bf16":
                mg, hf = mg.to(torch.bfloat16), hf.to(torch.bfloat16)
            if rec:
                rec.clear()
            case = {
                "name": f"{name}_{dtype}_{routing}",
                "model": kind,
                "dtype": dtype,
                "routing": routing,
                "layout": "TP1 PP1 EP1 (1 GPU)",
                **compare_logits(hf_logits(hf, tokens), megatron_logits(mg, tokens)),
            }
            if rec:
                case["expert_set_differs_share"] = rec.differs_share(experts)
            out.append(case)
        if rec:
            rec.remove()
        del mg, hf
        torch.cuda.empty_cache()
    return out


def _all_tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _same_bits(x: Any, y: Any) -> bool:
    import torch

    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    return torch.equal(x.view(torch.uint8), y.view(torch.uint8)) if x.numel() else True


def identical_names(original: str | Path, exported: str | Path) -> tuple[list[str], list[str]]:
    """(names bit-identical in both folders, names present in both that differ); an exported tensor
    of another dtype is compared after a cast to the original's (BF16 -> FP32 -> BF16 is exact)."""
    a, b = _all_tensors(Path(original)), _all_tensors(Path(exported))
    both = sorted(set(a) & set(b))
    same = [k for k in both if _same_bits(a[k], b[k].to(a[k].dtype))]
    return same, sorted(set(both) - set(same))


def tensors_identical(original: str | Path, exported: str | Path) -> dict[str, Any]:
    """Every tensor of two HF folders compared bit for bit (names, dtypes, shapes, bytes)."""
    a, b = _all_tensors(Path(original)), _all_tensors(Path(exported))
    same = [k for k in a if k in b and _same_bits(a[k], b[k])]
    recast = sorted({f"{a[k].dtype} -> {b[k].dtype}" for k in a if k in b and a[k].dtype != b[k].dtype})
    return {
        "tensors_original": len(a),
        "tensors_exported": len(b),
        "identical": len(same),
        "dtype_changes": recast,
        "only_in_original": sorted(set(a) - set(b))[:5],
        "only_in_export": sorted(set(b) - set(a))[:5],
        "bit_identical": len(same) == len(a) == len(b),
    }
