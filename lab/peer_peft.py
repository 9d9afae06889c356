"""The transformers + PEFT peer of a one-GPU LoRA recipe: the same workload on the road most
Qwen3.5 fine-tuning guides take, timed over the same window of steps as ``scripts/benchmark.py``.

    python -m lab.peer_peft --recipe qwen35_27b_peft_1gpu_h200_bf16_lowmem_config \\
        --rows DIR --steps 20 --window 5 19 --out peer.json [KEY=VALUE ...]

What it runs, read from the recipe's config as built for ``--dataset sft-rows`` with the KEY=VALUE
overrides (the same ones ours gets):

- model: transformers' own ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` from the catalog's
  config of the recipe's model (:func:`bridge_recipes.models.qwen35.hf_config`: every layer and
  expert, the full vocabulary), random weights, BF16, built on the GPU. transformers builds no MTP
  layer and adds no router load-balancing loss unless asked; the recipes train an MTP layer, and
  the MoE recipe adds that loss.
- adapters: PEFT LoRA with the recipe's rank, alpha and dropout on the modules its targets name
  (:data:`HF_TARGETS`: attention q/k/v/o_proj, the Gated DeltaNet's in_proj_qkv/z/b/a and out_proj,
  dense and shared-expert gate/up/down_proj) and on the routed experts' ``gate_up_proj`` /
  ``down_proj`` through PEFT's ``target_parameters``. PEFT gives each expert its own adapter (the
  recipes share one across a GPU's experts) and a fused Megatron projection three or four (one
  each for q, k, v; qkv, z, b, a); it keeps the adapters in FP32 (its default).
- kernels: transformers' defaults: SDPA attention (``flash_attention_2`` when flash-attn is
  installed), ``grouped_mm`` experts, and the Gated DeltaNet through flash-linear-attention's chunk
  kernel: on a GPU the peer stops unless transformers picked that kernel. The recipe's allocator
  setting (``PYTORCH_CUDA_ALLOC_CONF`` of its environment) applies to the peer too.
- rows: the recipe's own data path (:class:`bridge_recipes.data.packed_rows.PackedRowsDataset`),
  the same rows in the same order, one row per micro batch, the recipe's global batch of rows per
  step. A row with conversation boundaries goes in with its position ids (restarting at each
  conversation) and its ``cu_seqlens`` as ``cu_seq_lens_q/k``: transformers turns the position ids
  into a block-diagonal causal mask (varlen with flash-attn) and restarts rotary positions, and
  flash-linear-attention restarts the recurrent state at each boundary. The Gated DeltaNet's
  4-tap convolution is transformers' PyTorch one unless the causal-conv1d package is installed
  (PyPI has its source only: it does not install offline); the PyTorch one takes no boundaries,
  so the first 3 tokens of a conversation see the end of the one before.
- loss and step: cross entropy summed over the step's supervised tokens (the rows' loss mask) and
  divided by their count, as the recipes' per-token loss (the logits of the last hidden states
  through the output layer: in FP32 over the whole vocabulary with ``--peer-stack plain``, a chunk
  at a time with the fused linear cross entropy of the other stacks); gradient checkpointing of
  every decoder layer (non-reentrant), as the recipes recompute every layer; fused AdamW on the
  adapters with the recipe's learning rate (constant: the schedule does not change a step's cost), betas, epsilon,
  weight decay and gradient clipping.
- measured: each step's wall time (data included, the GPU synchronized), tokens/s and the step-time
  spread over the window (:func:`bridge_recipes.logs.stats.summarize`, as for ours), the peak
  allocated memory (GB = 1e9 bytes) and the loss per step, written as JSON. A run that fails (e.g.
  out of memory) writes its error instead of figures and exits 1.

The peer stack (``--peer-stack``, :data:`STACKS`), what a user on one card would run:

- ``plain``: transformers' and PEFT's defaults as above;
- ``liger``: liger-kernel's fused linear cross entropy (the logits never materialized), its RMSNorm
  and, on the dense model, its SwiGLU MLP (the MoE's experts keep transformers' grouped GEMM, on
  which PEFT's expert adapters sit);
- ``unsloth``: Unsloth's LoRA (``FastModel.get_peft_model``, its offloaded gradient checkpointing)
  and its fused cross entropy.

Every stack uses the causal-conv1d package's convolution where it is installed (then with the
rows' conversation boundaries as its ``seq_idx``) and flash-linear-attention's chunk kernel. A stack
whose packages do not import writes ``not_installed`` instead of figures and exits 3: a fact about
the host, not a failure of the run.

On a CPU (the unit tests' toy, ``--size`` shrinking the catalog model) the same code runs with
transformers' PyTorch Gated DeltaNet, which takes no boundaries. ``--dry-run`` builds the full
model and its adapters on the meta device, checks the rows, and trains nothing.
Exit status 0 on success, 2 on bad input or a missing kernel, 1 when the run fails, 3 when the
stack's packages are not installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bridge_recipes.config.datasets import row_tokens as tokens_per_row
from bridge_recipes.config.datasets import rows_per_step
from bridge_recipes.logs.stats import BYTES_PER_GB, DEFAULT_WINDOW, StepRecord, summarize
from bridge_recipes.utils.outputs import write_text_atomic

# Each LoRA target of the recipes (Megatron-Core module names, common.LORA_TARGETS) as the
# transformers Qwen3.5 modules it covers: Megatron fuses what transformers keeps apart.
HF_TARGETS: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),  # attention; q_proj also holds the output gate
    "linear_proj": ("o_proj",),
    "in_proj": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),  # Gated DeltaNet
    "out_proj": ("out_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),  # dense MLP and shared expert
    "linear_fc2": ("down_proj",),
}
# The routed experts are 3-D parameters in transformers, reached by PEFT's target_parameters.
HF_EXPERT_PARAMETERS: dict[str, str] = {
    "linear_fc1": "mlp.experts.gate_up_proj",
    "linear_fc2": "mlp.experts.down_proj",
}
# The unit tests' CPU toys (--size), by model kind: a few layers of the real Gated DeltaNet /
# attention pattern, widths of tens, the fixture tokenizer's vocabulary.
_CPU_TOY = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "vocab_size": 1024,
}
CPU_TOY_SIZES: dict[str, dict[str, int]] = {
    "dense": {**_CPU_TOY, "ffn_hidden_size": 128},
    "moe": {
        **_CPU_TOY,
        "num_experts": 4,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 32,
        "moe_shared_expert_ffn_hidden_size": 32,
    },
}
FLA = "fla."  # flash-linear-attention's modules
# transformers' module-level Gated DeltaNet chunk kernel after 5.12 (5.12 binds one to each layer)
MODULE_KERNEL = "torch_chunk_gated_delta_rule"
LOG = "[peer]"


NOT_INSTALLED = 3  # the exit status of a stack whose packages do not import


class PeerError(Exception):
    """Bad input or a missing package or kernel (exit 2)."""


class NotInstalled(Exception):
    """The chosen stack's packages do not import here (exit :data:`NOT_INSTALLED`)."""


def _log(msg: str) -> None:
    print(f"{LOG} {msg}", flush=True)


# --- the workload, from the recipe ---------------------------------------------------------


def workload_config(recipe: str, rows: str | Path, overrides: Sequence[str] = ()) -> Any:
    """The recipe's config as ours builds it for ``--dataset sft-rows`` on ``rows`` with
    ``overrides``; PeerError for an unknown recipe, a bad override, a recipe without LoRA, or rows
    the recipe's data path refuses."""
    import bridge_recipes
    from bridge_recipes.config.overrides import OverrideError
    from bridge_recipes.data.packed_rows import dry_run_problems
    from bridge_recipes.recipes import registry

    try:
        cfg = bridge_recipes.build(
            recipe, dataset="sft-rows", overrides=[f"dataset.path={Path(rows).resolve()}", *overrides]
        )
    except (registry.UnknownRecipe, OverrideError, ValueError) as exc:
        raise PeerError(str(exc)) from None
    if cfg.peft is None:
        raise PeerError(f"--recipe {recipe}: not a LoRA recipe (its peft is unset); the peer trains LoRA adapters")
    errors = dry_run_problems(cfg)[0]
    if errors:
        raise PeerError(f"--rows {rows}: {errors[0]}")
    return cfg


def workload_key(cfg: Any) -> dict[str, Any]:
    """Everything the peer takes from a recipe's config (:func:`workload_config`): two recipes with
    the same key give the same peer run, so a comparison runs it once for both."""
    o, peft = cfg.optimizer, cfg.peft
    return {
        "model": dataclasses.asdict(model_spec(cfg)),
        "lora": [peft.dim, peft.alpha, peft.dropout, sorted(peft.target_modules)],
        "optimizer": [o.lr, o.adam_beta1, o.adam_beta2, o.adam_eps, o.weight_decay, o.clip_grad],
        # ours may join rows into one sequence; the peer trains the same rows, one per micro batch
        "rows": [str(cfg.dataset.path), rows_per_step(cfg), tokens_per_row(cfg)],
        "allocator": (cfg.env_vars or {}).get(ALLOCATOR),
    }


def model_spec(cfg: Any, sizes: dict[str, int] | None = None) -> Any:
    """The catalog spec of the recipe's model as configured, with ``sizes`` (spec fields) changed."""
    from bridge_recipes.bench.harness import model_spec as spec_of

    spec = spec_of(cfg)
    names = {f.name for f in dataclasses.fields(spec)}
    unknown = sorted(set(sizes or ()) - names)
    if unknown:
        raise PeerError(f"--size {unknown[0]}: not a field of the model spec; choose from {', '.join(sorted(names))}")
    changes: dict[str, Any] = dict(sizes or {})
    return dataclasses.replace(spec, **changes)


def lora_config(peft: Any, moe: bool) -> Any:
    """PEFT's LoraConfig for the recipe's Megatron-Bridge LoRA ``peft``: its rank, alpha and dropout
    on the transformers modules (and expert parameters) of its targets."""
    from peft import LoraConfig

    unknown = [t for t in peft.target_modules if t not in HF_TARGETS]
    if unknown:
        raise PeerError(f"LoRA target {unknown[0]!r} has no transformers counterpart in peer_peft.HF_TARGETS")
    modules = sorted({m for t in peft.target_modules for m in HF_TARGETS[t]})
    params = sorted(HF_EXPERT_PARAMETERS[t] for t in peft.target_modules if moe and t in HF_EXPERT_PARAMETERS)
    return LoraConfig(
        r=peft.dim,
        lora_alpha=peft.alpha,
        lora_dropout=peft.dropout,
        target_modules=modules,
        target_parameters=params or None,
        bias="none",
    )


# --- the peer stacks -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Stack:
    """A peer configuration: the packages it imports (each must import, else it is not installed)
    and what it changes of the plain transformers + PEFT run."""

    name: str
    modules: tuple[str, ...]
    summary: str


STACKS: dict[str, Stack] = {
    s.name: s
    for s in (
        Stack("plain", (), "transformers + PEFT defaults, the loss on FP32 logits"),
        Stack(
            "liger",
            ("liger_kernel",),
            "Liger's fused linear cross entropy, RMSNorm and (dense model) SwiGLU MLP",
        ),
        Stack("unsloth", ("unsloth", "unsloth_zoo"), "Unsloth's LoRA, offloaded checkpointing, fused cross entropy"),
    )
}
# the order lab.lora_vs_peft tries them in: the fastest expected under a memory cap first
BY_EXPECTED_SPEED = ("unsloth", "liger", "plain")
DEFAULT_STACK = "plain"
CONV_KERNEL = "causal_conv1d"  # the causal-conv1d package's modules


def stack_import_problem(stack: str) -> str | None:
    """Why ``stack``'s packages do not import here (any error importing them: absent, built for
    another torch, no GPU for a package that needs one), or None."""
    import importlib

    for module in STACKS[stack].modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # an import that fails for any reason leaves the stack unusable here
            first = (str(exc).strip().splitlines() or [""])[0]
            return f"{module} does not import: {type(exc).__name__}: {first}".rstrip(": ")
    return None


def plain_loss(hidden: Any, weight: Any, labels: Any) -> Any:
    """Cross entropy summed over the supervised tokens (labels not -100), on the FP32 logits of
    ``hidden`` through the output layer ``weight``: transformers' default road."""
    import torch.nn.functional as F

    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100, reduction="sum")


def liger_functions() -> tuple[dict[str, Any], Any]:
    """Liger's model patches by model kind (``dense``, ``moe``) and its fused linear cross entropy."""
    from liger_kernel.transformers import apply_liger_kernel_to_qwen3_5, apply_liger_kernel_to_qwen3_5_moe
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return {"dense": apply_liger_kernel_to_qwen3_5, "moe": apply_liger_kernel_to_qwen3_5_moe}, (
        liger_fused_linear_cross_entropy
    )


def liger_prepare(model: Any, moe: bool) -> Any:
    """The model with Liger's RMSNorm and, on the dense model, its SwiGLU MLP (which calls the
    gate, up and down projections as modules, so PEFT's adapters on them still apply); the MoE's
    experts keep transformers' grouped GEMM, which PEFT's expert adapters wrap. The loss is not
    patched: :func:`liger_loss` computes it with the rows' mask."""
    patches, _ = liger_functions()
    patches["moe" if moe else "dense"](
        model=model, rope=False, cross_entropy=False, fused_linear_cross_entropy=False, rms_norm=True, swiglu=not moe
    )
    return model


def liger_loss(hidden: Any, weight: Any, labels: Any) -> Any:
    """Liger's fused linear cross entropy, summed over the supervised tokens: the logits a chunk of
    tokens at a time, never the whole ``tokens x vocabulary`` matrix."""
    _, fused = liger_functions()
    return fused(hidden.view(-1, hidden.shape[-1]), weight, labels.view(-1), ignore_index=-100, reduction="sum")


def unsloth_adapters(model: Any, peft_cfg: Any, moe: bool, checkpointing: bool, seed: int) -> Any:
    """The model with Unsloth's LoRA of the recipe's ``peft_cfg`` (the modules and expert parameters
    of :func:`lora_config`) and its gradient checkpointing, which offloads the kept activations to
    the host."""
    from unsloth import FastModel

    lora = lora_config(peft_cfg, moe)
    return FastModel.get_peft_model(
        model,
        r=lora.r,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        target_modules=sorted(lora.target_modules),
        target_parameters=lora.target_parameters,
        bias="none",
        use_gradient_checkpointing="unsloth" if checkpointing else False,
        random_state=seed,
    )


def unsloth_loss(hidden: Any, weight: Any, labels: Any) -> Any:
    """Unsloth's chunked fused cross entropy, summed over the supervised tokens (the labels are
    already the next tokens: no shift)."""
    import torch
    from unsloth_zoo.fused_losses.cross_entropy_loss import unsloth_fused_ce_loss

    one = torch.ones((), device=hidden.device)  # divides the sum by one: the step divides it
    return unsloth_fused_ce_loss(None, hidden, weight, None, labels, n_items=one, shift_labels=False)


LOSSES = {"plain": plain_loss, "liger": liger_loss, "unsloth": unsloth_loss}


def causal_lm(model: Any) -> Any:
    """The transformers causal LM inside a PEFT model (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if get is not None else model


def conv_kernel(model: Any) -> str | None:
    """The module of the Gated DeltaNet's short convolution (``causal_conv1d...`` for the
    causal-conv1d package, transformers' own otherwise), None for a model without such layers.
    transformers 5.12 binds it to each layer (None: its PyTorch convolution); later releases
    call a module-level wrapper, followed through its closure."""
    for module in model.modules():
        if type(module).__name__.endswith("GatedDeltaNet"):
            if hasattr(module, "causal_conv1d_fn"):
                fn = module.causal_conv1d_fn
                return "torch" if fn is None else _called_module(fn, CONV_KERNEL)
            fn = getattr(sys.modules[type(module).__module__], "causal_conv1d_fn", None)
            return "torch" if fn is None else _called_module(fn, CONV_KERNEL)
    return None


# --- the model -------------------------------------------------------------------------------


def attention_default() -> str:
    """transformers' attention for packed rows here: flash-attn's varlen kernel when installed, else SDPA."""
    import importlib.util

    return "flash_attention_2" if importlib.util.find_spec("flash_attn") is not None else "sdpa"


def build_model(spec: Any, device: str, attn: str, gradient_checkpointing: bool, seed: int = 1234) -> Any:
    """transformers' causal LM of ``spec`` with random BF16 weights, built on ``device`` (``meta``:
    shapes only), gradient checkpointing on every decoder layer when asked."""
    import torch
    from transformers import AutoModelForCausalLM

    from bridge_recipes.models.qwen35 import hf_config

    config = hf_config(spec)
    # a torch.dtype: transformers builds the Gated DeltaNet's fused norm with config.dtype as given
    config.dtype = torch.bfloat16
    config.use_cache = False
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation=attn)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def add_adapters(model: Any, peft_cfg: Any, moe: bool) -> Any:
    """The model with PEFT's LoRA of the recipe's ``peft_cfg``, the adapters made on the model's device."""
    import torch
    from peft import get_peft_model

    with torch.device(next(model.parameters()).device):
        return get_peft_model(model, lora_config(peft_cfg, moe))


def adapted_names(model: Any) -> list[str]:
    """What the adapters sit on: module names (``q_proj``, ...) and ``experts.<parameter>``."""
    from peft.tuners.lora import LoraLayer

    names = set()
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            parameter = getattr(module, "parameter_name", None)
            names.add(f"experts.{parameter}" if parameter else name.rsplit(".", 1)[-1])
    return sorted(names)


def gdn_kernel(model: Any) -> str | None:
    """The module of the Gated DeltaNet chunk kernel the model runs (``fla....`` for
    flash-linear-attention), None for a model without Gated DeltaNet layers. transformers 5.12 binds
    the kernel to each layer; later releases pick it once in a module-level wrapper, followed here
    through its closure to the function it calls."""
    for module in model.modules():
        if type(module).__name__.endswith("GatedDeltaNet"):
            fn = getattr(module, "chunk_gated_delta_rule", None)
            if fn is None:
                fn = getattr(sys.modules[type(module).__module__], MODULE_KERNEL, None)
            return _called_module(fn)
    return None


def _called_module(fn: Any, prefix: str = FLA, depth: int = 4) -> str:
    """The module of ``fn``, or of a function of a module starting with ``prefix`` (default
    flash-linear-attention's) among the functions its closure holds (wrappers that choose an
    implementation), searched ``depth`` levels deep."""
    todo, seen = [(fn, 0)], set()
    while todo:
        f, d = todo.pop(0)
        if id(f) in seen:
            continue
        seen.add(id(f))
        if str(getattr(f, "__module__", "")).startswith(prefix):
            return f.__module__
        if d < depth:
            for cell in getattr(f, "__closure__", None) or ():
                try:
                    inner = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if callable(inner):
                    todo.append((inner, d + 1))
    return str(getattr(fn, "__module__", type(fn).__name__))


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in (
        "torch",
        "transformers",
        "peft",
        "flash-linear-attention",
        "flash-attn",
        "causal-conv1d",
        "liger-kernel",
        "unsloth",
    ):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def stack_summary(stack: dict[str, Any]) -> str:
    """One line naming what the peer ran (the comparison file's ``peer_stack``)."""
    v = stack["versions"]
    gdn = "flash-linear-attention" if stack["gdn_kernel"].startswith(FLA) else "PyTorch reference"
    conv = stack.get("conv_kernel") or "torch"
    conv_text = "" if conv == "torch" else f", convolution causal-conv1d {v.get('causal-conv1d')}"
    name = stack.get("stack", DEFAULT_STACK)
    extra = {"liger": f" with Liger {v.get('liger-kernel')}", "unsloth": f" with Unsloth {v.get('unsloth')}"}
    loss = "" if name == DEFAULT_STACK else f"; {STACKS[name].summary}"
    return (
        f"transformers {v['transformers']} + PEFT {v['peft']} LoRA{extra.get(name, '')}, torch {v['torch']}; "
        f"attention {stack['attention']}, experts {stack['experts']}, Gated DeltaNet {gdn} ({stack['gdn_kernel']})"
        f"{conv_text}{loss}; "
        f"gradient checkpointing {'on' if stack['gradient_checkpointing'] else 'off'}; "
        f"adapters {stack['adapter_dtype']}, fused AdamW"
    )


# --- training --------------------------------------------------------------------------------


def micro_batch(sample: dict, device: Any, seq_idx: bool = False) -> tuple[dict, Any, Any]:
    """Model keywords, labels (-100 where nothing is supervised) and loss mask of one row; with
    ``seq_idx``, each token's conversation index for the causal-conv1d package's convolution."""
    import torch

    tokens = sample["tokens"][None].to(device, non_blocking=True)
    labels = sample["labels"].masked_fill(sample["loss_mask"] == 0, -100)[None].to(device, non_blocking=True)
    kwargs = {"input_ids": tokens, "position_ids": sample["position_ids"][None].to(device, non_blocking=True)}
    if "cu_seqlens_q" in sample:
        cu = sample["cu_seqlens_q"].to(device=device, dtype=torch.int32, non_blocking=True)
        longest = int(sample["max_seqlen_q"])
        kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
        if seq_idx:
            lengths = (cu[1:] - cu[:-1]).long()
            index = torch.repeat_interleave(torch.arange(len(lengths), device=device, dtype=torch.int32), lengths)
            kwargs["seq_idx"] = index[None].contiguous()
    return kwargs, labels, sample["loss_mask"]


def train(
    model: Any,
    dataset: Any,
    *,
    steps: int,
    global_batch: int,
    optimizer_cfg: Any,
    device: Any,
    loss_fn: Any = plain_loss,
    seq_idx: bool = False,
) -> list[dict]:
    """``steps`` optimizer steps of ``global_batch`` rows each; one record per step: its 1-based index, wall
    time, tokens, loss and the peak allocated bytes so far (GPU only). ``loss_fn(hidden, weight, labels)``
    sums the cross entropy of a row's last hidden states through the output layer's weight;
    ``seq_idx``: pass each token's conversation index (:func:`micro_batch`)."""
    import torch

    cuda = torch.device(device).type == "cuda"
    params = [p for p in model.parameters() if p.requires_grad]
    o = optimizer_cfg
    opt = torch.optim.AdamW(
        params,
        lr=o.lr,
        betas=(o.adam_beta1, o.adam_beta2),
        eps=o.adam_eps,
        weight_decay=o.weight_decay,
        fused=cuda,
    )
    model.train()
    lm = causal_lm(model)
    records = []
    for step in range(1, steps + 1):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        samples = [dataset[(step - 1) * global_batch + i] for i in range(global_batch)]
        supervised = max(1.0, float(sum(s["loss_mask"].sum() for s in samples)))
        total = torch.zeros((), device=device)
        for sample in samples:
            kwargs, labels, _ = micro_batch(sample, device, seq_idx)
            hidden = lm.model(**kwargs).last_hidden_state
            loss = loss_fn(hidden, lm.lm_head.weight, labels)
            (loss / supervised).backward()
            total += loss.detach()
            del hidden, loss
        if o.clip_grad:
            torch.nn.utils.clip_grad_norm_(params, o.clip_grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = float(total) / supervised  # a host copy: waits for the step
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() if cuda else None
        tokens = sum(int(s["tokens"].numel()) for s in samples)
        records.append({"step": step, "time_s": seconds, "tokens": tokens, "loss": loss_value, "peak_bytes": peak})
        peak_text = f", peak {peak / BYTES_PER_GB:.1f} GB" if peak else ""
        _log(
            f"step {step}/{steps}: {seconds:.2f} s, {tokens / seconds:.0f} tokens/s, loss {loss_value:.4f}{peak_text}"
        )
    return records


def measured(records: list[dict], window: tuple[int, int], useful_share: float | None) -> dict:
    """Window figures of the step records, as the benchmark result files give ours'."""
    stats = summarize(
        [
            StepRecord(
                r["step"],
                r["time_s"],
                r["tokens"],
                peak_allocated_bytes=() if r["peak_bytes"] is None else r["peak_bytes"],
            )
            for r in records
        ],
        window,
    )
    out = {
        "tokens_per_s": round(stats.tokens_per_s_per_gpu, 1),
        "step_time_mean_s": round(stats.step_time_mean_s, 4),
        "step_time_cv_percent": round(stats.step_time_cv_percent, 2),
        "peak_allocated_gb": None if stats.peak_allocated_gb is None else round(stats.peak_allocated_gb, 3),
        "window": list(window),
    }
    if useful_share is not None:
        out["useful_tokens_per_s"] = round(stats.tokens_per_s_per_gpu * useful_share, 1)
    return out


_HEADER = re.compile(
    r"^\[peer\] \S+: (?P<model>\S+) .* on \S+; (?P<gb>\d+) rows of (?P<row>\d+) tokens (?:per|a) step"
    r" .*, (?P<steps>\d+) steps$"
)
_STEP = re.compile(
    r"^\[peer\] step (?P<step>\d+)/\d+: (?P<s>[\d.]+) s, [\d.]+ tokens/s, loss (?P<loss>[\d.naninf+-]+)"
    r"(?:, peak (?P<peak>[\d.]+) GB)?$"
)


def result_from_log(text: str, window: tuple[int, int], useful_share: float | None) -> dict:
    """The peer's figures from its log alone (the ``[peer]`` lines), for a run whose JSON was never
    written, such as one stopped before its last step: the window ends at the last step logged,
    and ``cut_short`` says so. The peak is the log's (0.1 GB), the step times its (10 ms). Logs
    written before the header said "per step" read "a step" there; both parse."""
    lines = text.splitlines()
    header = next((m for m in map(_HEADER.match, lines) if m), None)
    if header is None:
        raise ValueError("no '[peer] RECIPE: MODEL ... N rows of T tokens per step ..., S steps' line in the log")
    tokens = int(header["gb"]) * int(header["row"])
    records: list[dict[str, Any]] = [
        {
            "step": int(m["step"]),
            "time_s": float(m["s"]),
            "tokens": tokens,
            "loss": float(m["loss"]),
            "peak_bytes": None if m["peak"] is None else round(float(m["peak"]) * BYTES_PER_GB),
        }
        for m in map(_STEP.match, lines)
        if m
    ]
    last: int = records[-1]["step"] if records else 0
    planned = int(header["steps"])
    first = window[0]
    if last < first + 2:
        raise ValueError(f"the log ends after step {last}: too few steps for a window from step {first}")
    stack = next((ln.split("] stack: ", 1)[1] for ln in lines if ln.startswith(f"{LOG} stack: ")), None)
    kernel = next((ln.split("] ", 1)[1] for ln in lines if ln.startswith(f"{LOG} Gated DeltaNet chunk kernel")), None)
    doc = {
        "model": header["model"],
        "peer_stack": stack or kernel,
        "result": measured(records, (first, min(window[1], last)), useful_share),
        "steps": [{"step": r["step"], "time_s": r["time_s"], "loss": r["loss"]} for r in records],
    }
    if last < planned:
        doc["cut_short"] = f"the log ends after step {last} of {planned}"
    return doc


# --- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lab.peer_peft",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--recipe", required=True, help="the LoRA recipe whose workload the peer runs")
    ap.add_argument("--rows", required=True, metavar="DIR", help="packed SFT rows (scripts/build_sft_rows.py)")
    ap.add_argument("--steps", type=int, default=DEFAULT_WINDOW[1] + 1)
    ap.add_argument("--window", type=int, nargs=2, default=list(DEFAULT_WINDOW), metavar=("FIRST", "LAST"))
    ap.add_argument("--out", help="result file (.json); required unless --dry-run")
    ap.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="FIELD=N",
        help="change a field of the catalog model (e.g. num_layers=4 hidden_size=64; tests on a CPU)",
    )
    ap.add_argument(
        "--attn", help="transformers attention implementation (default: flash_attention_2 if installed, else sdpa)"
    )
    ap.add_argument(
        "--peer-stack",
        default=DEFAULT_STACK,
        metavar="NAME",
        help=f"the peer configuration: {', '.join(STACKS)} (default {DEFAULT_STACK}; see above)",
    )
    ap.add_argument("--no-gradient-checkpointing", action="store_true", help="keep every layer's activations")
    ap.add_argument("--device", help="cuda (default when there is one) or cpu")
    ap.add_argument(
        "--gpu-memory-gb",
        type=float,
        metavar="GB",
        help="train within GB of the GPU's memory (as ours' runner: bridge_recipes.hardware.gpu_memory)",
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dry-run", action="store_true", help="build on the meta device, check the rows, train nothing")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides of the recipe, as ours gets them")
    return ap


def size_args(sizes: dict[str, int]) -> list[str]:
    """``--size FIELD=N`` arguments of ``sizes`` (e.g. a :data:`CPU_TOY_SIZES` entry)."""
    return [a for k, v in sizes.items() for a in ("--size", f"{k}={v}")]


def sizes_of(items: Sequence[str]) -> dict[str, int]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key.strip()] = int(value)
        except ValueError:
            raise PeerError(f"--size {item}: give FIELD=N with N a whole number") from None
        if not sep:
            raise PeerError(f"--size {item}: give FIELD=N")
    return out


def argument_problems(opts: argparse.Namespace) -> list[str]:
    from bridge_recipes.bench.benchmark import steps_problems
    from bridge_recipes.utils.outputs import output_problem

    out = steps_problems(opts.steps, opts.window)
    if not opts.dry_run and not opts.out:
        out.append("--out FILE is required (the result file)")
    elif opts.out and (problem := output_problem(opts.out, option="--out", inputs=[("--rows", opts.rows)])):
        out.append(problem)
    if opts.device not in (None, "cuda", "cpu"):
        out.append(f"--device {opts.device}: cuda or cpu")
    if opts.peer_stack not in STACKS:
        out.append(f"--peer-stack {opts.peer_stack}: unknown; choose one of {', '.join(STACKS)}")
    return out


def imports_problem() -> str | None:
    import importlib.util

    missing = [m for m in ("transformers", "peft") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed: bash scripts/install.sh (requirements/cpu.lock pins them)"
    return None


ALLOCATOR = "PYTORCH_CUDA_ALLOC_CONF"


def run(opts: argparse.Namespace, command: str) -> int:
    cfg = workload_config(opts.recipe, opts.rows, opts.overrides)
    if ALLOCATOR in (cfg.env_vars or {}) and ALLOCATOR not in os.environ:
        # the recipe's allocator setting, before the first CUDA allocation (ours starts with it)
        os.environ[ALLOCATOR] = str(cfg.env_vars[ALLOCATOR])
    import torch

    from bridge_recipes.bench.harness import rows_workload

    spec = model_spec(cfg, sizes_of(opts.size))
    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise PeerError("--device cuda: torch sees no CUDA GPU")
    cap_gb = None if opts.dry_run else opts.gpu_memory_gb
    if cap_gb is not None:
        from bridge_recipes.hardware import gpu_memory

        if problem := gpu_memory.cap_problem(cap_gb, gpu_memory.current_device() if device == "cuda" else None):
            raise PeerError(problem)
        _log(gpu_memory.cap(cap_gb))
    attn = opts.attn or attention_default()
    checkpointing = not opts.no_gradient_checkpointing
    rows = rows_workload(cfg) or {}  # the config reads SFT rows: always there
    gb, row_tokens = rows_per_step(cfg), tokens_per_row(cfg)
    _log(
        f"{opts.recipe}: {spec.name} ({spec.num_layers} layers, {spec.num_experts or 'no'} experts, vocabulary "
        f"{spec.vocab_size}) on {'meta' if opts.dry_run else device}; {gb} rows of {row_tokens} tokens per step "
        f"({rows['packing']} rows), {opts.steps} steps"
    )
    doc: dict[str, Any] = {
        "recipe": opts.recipe,
        "model": spec.name,
        "workload": {
            "row_tokens": row_tokens,
            "global_batch": gb,
            "steps": opts.steps,
            "rows": rows,
            "mtp_layers_of_the_recipe": spec.mtp_num_layers,
        },
        "command": command,
    }
    name = opts.peer_stack
    doc["peer_stack_name"] = name
    if problem := stack_import_problem(name):
        raise NotInstalled(f"--peer-stack {name}: {problem}")
    try:
        where = "meta" if opts.dry_run else device
        model = prepared_model(name, spec, cfg.peft, where, attn, checkpointing, opts.seed)
    except torch.OutOfMemoryError as exc:
        doc["gpu_memory_gb"] = cap_gb
        return failed(doc, opts.out, f"out of memory: {str(exc).splitlines()[0]}")
    except Exception as exc:  # a stack that cannot take this model: recorded as its failure, not a traceback
        first = (str(exc).strip().splitlines() or [""])[0]
        return failed(doc, opts.out, f"the {name} stack could not prepare the model: {type(exc).__name__}: {first}")
    try:
        kernel = str(gdn_kernel(model))
        conv = str(conv_kernel(model))
        adapter = next(p for p in model.parameters() if p.requires_grad)
        stack = {
            "stack": name,
            "versions": versions(),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "attention": model.config._attn_implementation,
            "experts": getattr(model.config, "_experts_implementation", None) if spec.is_moe else None,
            "gdn_kernel": kernel,
            "conv_kernel": conv,
            "gradient_checkpointing": checkpointing,
            "adapter_dtype": str(adapter.dtype).removeprefix("torch."),
            "allocator": os.environ.get(ALLOCATOR),
        }
        doc.update(peer_stack=stack_summary(stack), stack=stack)
        doc["lora"] = {
            "rank": cfg.peft.dim,
            "alpha": cfg.peft.alpha,
            "modules": adapted_names(model),
            "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        }
        lora = doc["lora"]
        _log(
            f"LoRA r{lora['rank']} alpha {lora['alpha']}: {lora['trainable_parameters']:,} trainable parameters "
            f"on {', '.join(lora['modules'])}"
        )
        _log(f"Gated DeltaNet chunk kernel here: {kernel}; attention {stack['attention']}; convolution {conv}")
        _log(f"stack: {doc['peer_stack']}")
        if device == "cuda" and not opts.dry_run and not kernel.startswith(FLA):
            raise PeerError(
                f"the Gated DeltaNet runs {kernel}, not flash-linear-attention's kernel: install "
                "flash-linear-attention (requirements/cpu.lock pins it)"
            )
        if opts.dry_run:
            _log("dry run: model and adapters built on the meta device, rows checked; nothing trained")
            return 0
        from bridge_recipes.data.packed_rows import PackedRowsDataset

        dataset = PackedRowsDataset(cfg.dataset.path, row_tokens, opts.steps * gb, vocab_size=spec.vocab_size)
        records = train(
            model,
            dataset,
            steps=opts.steps,
            global_batch=gb,
            optimizer_cfg=cfg.optimizer,
            device=device,
            loss_fn=LOSSES[name],
            seq_idx=conv.startswith(CONV_KERNEL),
        )
    except torch.OutOfMemoryError as exc:
        doc["gpu_memory_gb"] = cap_gb
        return failed(doc, opts.out, f"out of memory: {str(exc).splitlines()[0]}")
    losses = [r["loss"] for r in records]
    if not all(math.isfinite(x) for x in losses):
        return failed(doc, opts.out, f"a loss is not finite: {losses}")
    doc["result"] = measured(records, tuple(opts.window), rows["useful_token_share"])
    if cap_gb is not None:
        from bridge_recipes.hardware import gpu_memory

        doc["gpu_memory_gb"] = cap_gb
        doc["gpu_memory"] = gpu_memory.summary(cap_gb)
        _log(doc["gpu_memory"])
    doc["steps"] = [{"step": r["step"], "time_s": round(r["time_s"], 4), "loss": round(r["loss"], 6)} for r in records]
    write_text_atomic(Path(opts.out), json.dumps(doc, indent=1) + "\n")
    r = doc["result"]
    peak = f", peak {r['peak_allocated_gb']} GB" if r["peak_allocated_gb"] is not None else ""
    _log(f"{opts.recipe}: {r['tokens_per_s']} tokens/s, CV {r['step_time_cv_percent']}%{peak}; written to {opts.out}")
    return 0


def failed(doc: dict, out: str | None, error: str) -> int:
    """Write the result of a run that gave no figures (``error`` says why; nothing written without
    ``out``, as in a dry run); exit status 1."""
    doc.update(result=None, error=error)
    if out:
        write_text_atomic(Path(out), json.dumps(doc, indent=1) + "\n")
    print(f"peer_peft: {error}", file=sys.stderr)
    return 1


def prepared_model(name: str, spec: Any, peft_cfg: Any, device: str, attn: str, checkpointing: bool, seed: int) -> Any:
    """The model of ``spec`` with the recipe's adapters as stack ``name`` sets them up (Unsloth
    checkpoints the layers its own way)."""
    model = build_model(spec, device, attn, checkpointing and name != "unsloth", seed)
    if name == "liger":
        model = liger_prepare(model, spec.is_moe)
    if name == "unsloth":
        return unsloth_adapters(model, peft_cfg, spec.is_moe, checkpointing, seed)
    return add_adapters(model, peft_cfg, spec.is_moe)


def not_installed(opts: argparse.Namespace, command: str, reason: str) -> int:
    """Record that the chosen stack's packages do not import here (its result file, when asked
    for); exit status :data:`NOT_INSTALLED`."""
    doc = {
        "recipe": opts.recipe,
        "peer_stack_name": opts.peer_stack,
        "command": command,
        "result": None,
        "not_installed": reason,
    }
    if opts.out:
        write_text_atomic(Path(opts.out), json.dumps(doc, indent=1) + "\n")
    print(f"peer_peft: not installed: {reason}", file=sys.stderr)
    return NOT_INSTALLED


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    opts = ap.parse_intermixed_args(argv)
    problems = argument_problems(opts)
    if problems:
        ap.error("; ".join(problems))
    if problem := imports_problem():
        print(f"peer_peft: {problem}", file=sys.stderr)
        return 2
    command = "python -m lab.peer_peft " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        return run(opts, command)
    except PeerError as exc:
        print(f"peer_peft: {exc}", file=sys.stderr)
        return 2
    except NotInstalled as exc:
        return not_installed(opts, command, str(exc))


if __name__ == "__main__":
    sys.exit(main())
