"""One training step of the SFT policies on packed real-format chat rows, on one H200, with every
gradient checked: the forward and backward through conversation boundaries (THD, ``cu_seqlens``)
must give finite losses and finite gradients.

The model is the recipe's own (its ``model.*`` settings: MoE routing and aux loss, MTP, recompute,
permute fusion), scaled to 4 layers (32 experts for the 35B-A3B) as ``--scale-down 4`` does, and
the rows are the real-format evidence's (``bridge_recipes.data.synthetic_chat``, 2,048-token rows
with boundaries). The batch goes through Megatron-Bridge's own packed path (collate,
``_packed_metadata_for_forward``, ``get_packed_seq_params``) and the model is called as
``gpt_step`` calls it (no ``loss_mask`` argument; the loss is the masked sum). Besides the
recipe as it is, variants each switch one thing off, so a non-finite gradient is traced to its
part: no boundaries (the same tokens without ``packed_seq_params``), no recompute, no MoE aux
loss, no MTP. For each variant the first module whose forward output is non-finite and the
parameters whose gradient is non-finite are recorded.

    OUT=/path/for/results python3 -m pytest -q -m gpu tests/gpu/test_packed_training_step.py

Writes ``$OUT/packed_training_step.json``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from bridge_recipes.data.synthetic_chat import EVIDENCE_ROW_TOKENS, build_evidence_rows

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
OUT = Path(os.environ.get("OUT") or REPO / "gpu-out")
ROW = EVIDENCE_ROW_TOKENS  # the SFT real-format evidence's rows, whose first four are its first step's
MICRO_BATCHES = 4  # the evidence runs' global batch: 4 rows of 2,048 tokens, one per micro batch
FAMILIES = {
    "qwen35_35b_a3b": ("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", 32),
    "qwen35_27b": ("qwen35_27b_sft_8gpu_h200_bf16_config", None),
}
# Each variant: (model.* changes, whether the rows' boundaries are passed to the model).
VARIANTS = {
    "recipe": ({}, True),
    "no_boundaries": ({}, False),
    "no_recompute": ({"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None}, True),
    "no_aux_loss": ({"moe_aux_loss_coeff": 0.0, "moe_router_load_balancing_type": "none"}, True),
    "no_mtp": ({"mtp_num_layers": None}, True),
}
CASES = [("qwen35_35b_a3b", v) for v in VARIANTS] + [("qwen35_27b", "recipe")]
# The same step the way the runner takes it: the model wrapped as Megatron-Bridge wraps it
# (Float16Module, then DDP with the recipe's ddp config: FP32 gradient buffers, overlapped
# reduction, the NaN check on each bucket, the distributed optimizer's layout) and driven by
# Megatron-Core's forward-backward schedule with the per-token loss, then finalize_model_grads.
# Each: (ddp.* changes, boundaries).
PIPELINE_VARIANTS = {
    "pipeline": ({}, True),
    "pipeline_no_overlap": ({"overlap_grad_reduce": False}, True),
    "pipeline_no_boundaries": ({}, False),
}
PIPELINE_CASES = [("qwen35_35b_a3b", v) for v in PIPELINE_VARIANTS] + [("qwen35_27b", "pipeline")]


@pytest.fixture(scope="module")
def evidence_rows(tmp_path_factory):
    """The evidence's rows in a packing mode, built once per mode on first use."""
    tmp = tmp_path_factory.mktemp("evidence_rows")
    built: dict[str, Path] = {}

    def rows(packing: str) -> Path:
        if packing not in built:
            build_evidence_rows(tmp / packing, TOKENIZER, packing)
            built[packing] = tmp / packing
        return built[packing]

    return rows


def record(key: str, result: dict) -> None:
    """Add ``result`` under ``key`` to $OUT/packed_training_step.json and print it."""
    OUT.mkdir(parents=True, exist_ok=True)
    report = OUT / "packed_training_step.json"
    old = json.loads(report.read_text()) if report.exists() else {}
    old[key] = result
    report.write_text(json.dumps(old, indent=1, default=str) + "\n")
    print(json.dumps(result, default=str))


def forward(model, batch, meta, packed: bool):
    """The model called as gpt_step calls it: per-token losses, no loss_mask argument."""
    import torch
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    return model(
        input_ids=batch["tokens"].cuda(),
        position_ids=batch["position_ids"].cuda() if packed else torch.arange(ROW, device="cuda")[None],
        attention_mask=None,
        labels=batch["labels"].cuda(),
        packed_seq_params=get_packed_seq_params(dict(meta)) if packed else None,
    )


@pytest.fixture(scope="module")
def batches(evidence_rows):
    import torch.utils.data
    from megatron.bridge.training.gpt_step import _packed_metadata_for_forward

    from bridge_recipes.data.packed_rows import PackedRowsDataset
    from bridge_recipes.hf.parity import init_single_gpu

    init_single_gpu()
    rows = evidence_rows("boundaries")
    loader = torch.utils.data.DataLoader(PackedRowsDataset(rows, ROW, MICRO_BATCHES), batch_size=1)
    out = []
    for batch, _ in zip(loader, range(MICRO_BATCHES)):
        meta = {k: (v.cuda() if k.startswith("cu_") else v) for k, v in _packed_metadata_for_forward(batch).items()}
        out.append((batch, meta))
    return out


def recipe_config(recipe: str, experts: int | None, changes: dict):
    from bridge_recipes import registry
    from bridge_recipes.runner.launch import prepare_for_registry_install
    from bridge_recipes.scaledown import scale_down

    cfg = registry.load(recipe)()
    scale_down(cfg, num_layers=4, num_experts=experts, global_batch_size=MICRO_BATCHES, seq_length=ROW)
    prepare_for_registry_install(cfg)
    cfg.model.gradient_accumulation_fusion = False  # a bare model: gradients in .grad, no DDP main_grad
    for field, value in changes.items():
        setattr(cfg.model, field, value)
    cfg.model.finalize()
    return cfg


def build_model(recipe: str, experts: int | None, changes: dict):
    import torch
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    cfg = recipe_config(recipe, experts, changes)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    return cfg.model.provide(pre_process=True, post_process=True).cuda().train()


def first_nonfinite_forward(model) -> tuple[list[str], list]:
    """Forward hooks that record, in call order, the modules whose output holds a NaN or inf."""
    import torch

    seen: list[str] = []

    def hook(name):
        def check(_module, _inputs, output):
            outs = output if isinstance(output, tuple) else (output,)
            if any(
                isinstance(o, torch.Tensor) and o.is_floating_point() and not torch.isfinite(o).all() for o in outs
            ):
                seen.append(name)

        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    return seen, handles


def training_step(model, batches, packed: bool) -> dict:
    import torch

    seen, handles = first_nonfinite_forward(model)
    losses = []
    try:
        for batch, meta in batches:
            out = forward(model, batch, meta, packed)
            loss = (out.float().view(-1) * batch["loss_mask"].cuda().float().view(-1)).sum()
            losses.append(float(loss))
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    return {
        "losses": losses,
        "loss_tokens": [int(b["loss_mask"].sum()) for b, _ in batches],
        "nonfinite_forward_first": seen[:5],
        "nonfinite_grads": len(bad),
        "nonfinite_grad_names": bad[:12],
        "params_without_grad": no_grad[:12],
    }


@pytest.mark.parametrize("family,variant", CASES)
def test_training_step_through_boundaries_is_finite(batches, family, variant):
    import torch

    recipe, experts = FAMILIES[family]
    changes, packed = VARIANTS[variant]
    model = build_model(recipe, experts, changes)
    result = {"family": family, "variant": variant, "changes": changes, "boundaries": packed}
    result.update(training_step(model, batches, packed))
    del model
    torch.cuda.empty_cache()
    record(f"{family}/{variant}", result)
    assert all(map(lambda x: x == x and abs(x) != float("inf"), result["losses"])), result
    assert result["nonfinite_grads"] == 0, result


def pipeline_step(recipe: str, experts: int | None, ddp_changes: dict, batches, packed: bool) -> dict:
    """One step through Float16Module, DDP and Megatron-Core's schedule; the main gradients checked."""
    from functools import partial

    import torch
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    cfg = recipe_config(recipe, experts, {})
    ddp_cfg = cfg.ddp
    ddp_cfg.overlap_param_gather = False  # the gather follows an optimizer step; there is none here
    for field, value in ddp_changes.items():
        setattr(ddp_cfg, field, value)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    (ddp,) = cfg.model.provide_distributed_model(ddp_config=ddp_cfg, wrap_with_ddp=True)
    mc = cfg.model
    if ddp_cfg.overlap_grad_reduce:
        mc.no_sync_func, mc.grad_sync_func = ddp.no_sync, ddp.start_grad_sync
    mc.finalize_model_grads_func = finalize_model_grads
    ddp.train()
    ddp.zero_grad_buffer()
    losses: list[float] = []

    def loss_func(loss_mask, output):
        loss = (output.float().view(-1) * loss_mask.view(-1).float()).sum()
        tokens = loss_mask.sum().to(torch.int)
        losses.append(float(loss))
        return loss, tokens, {"lm loss": torch.stack([loss.detach(), tokens.float()])}

    def forward_step(data_iterator, model):
        batch, meta = next(data_iterator)
        return forward(model, batch, meta, packed), partial(loss_func, batch["loss_mask"].cuda())

    error = None
    try:
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(batches),
            model=[ddp],
            num_microbatches=len(batches),
            seq_length=ROW,
            micro_batch_size=1,
            forward_only=False,
        )
    except Exception as e:  # the DDP NaN check raises; record what it said
        error = f"{type(e).__name__}: {e}"[:600]
    params = list(ddp.module.named_parameters())
    bad = [n for n, p in params if getattr(p, "main_grad", None) is not None and not torch.isfinite(p.main_grad).all()]
    result = {
        "losses": losses,
        "error": error,
        "nonfinite_main_grads": len(bad),
        "nonfinite_main_grad_names": bad[:12],
        "ddp": {
            k: getattr(ddp_cfg, k)
            for k in (
                "overlap_grad_reduce",
                "grad_reduce_in_fp32",
                "use_distributed_optimizer",
                "check_for_nan_in_grad",
            )
        },
    }
    for attr in ("no_sync_func", "grad_sync_func", "finalize_model_grads_func"):
        setattr(mc, attr, None)
    del ddp
    torch.cuda.empty_cache()
    return result


@pytest.mark.parametrize("family,variant", PIPELINE_CASES)
def test_pipeline_step_through_boundaries_is_finite(batches, family, variant):
    recipe, experts = FAMILIES[family]
    changes, packed = PIPELINE_VARIANTS[variant]
    result = {"family": family, "variant": variant, "ddp_changes": changes, "boundaries": packed}
    result.update(pipeline_step(recipe, experts, changes, batches, packed))
    record(f"{family}/{variant}", result)
    assert result["error"] is None, result
    assert result["nonfinite_main_grads"] == 0, result


# The runner itself on the SFT real-format evidence's rows (the 35B-A3B, 3 steps each), where the
# NaN gradient was seen: as it ran, without the bucket NaN check (does the loss itself go NaN, what
# grad norm does step 1 report), with the experts as separate GEMMs instead of grouped ones, and on
# the same conversations one per padded row (no boundaries needed: the standard path, and the
# correct mode should packed THD rows not train). Each: (packing, overrides).
RUNNER_VARIANTS = {
    "runner_no_nan_check": ("boundaries", ["ddp.check_for_nan_in_grad=false"]),
    "runner_sequential_experts": ("boundaries", ["model.moe_grouped_gemm=false"]),
    "runner_one_per_row": ("one_per_row", []),
}
RUNNER_STEPS = 3
NO_SAVE = ["checkpoint.save=null", "checkpoint.load=null", "checkpoint.async_save=false"]


@pytest.mark.parametrize("variant", list(RUNNER_VARIANTS))
def test_runner_first_steps_on_real_format_rows(evidence_rows, variant):
    from bridge_recipes import runner_args
    from bridge_recipes.bench.evidence import EVIDENCE_TRAIN_FLAGS
    from bridge_recipes.bench.runs import launch

    packing, overrides = RUNNER_VARIANTS[variant]
    recipe, experts = FAMILIES["qwen35_35b_a3b"]
    args = runner_args(
        scale_down=4,
        scale_experts=experts,
        dataset="sft-rows",
        flags={**EVIDENCE_TRAIN_FLAGS, "mb": 1, "sl": ROW, "max_steps": RUNNER_STEPS},
        overrides=[
            f"dataset.path={evidence_rows(packing)}",
            *NO_SAVE,
            *overrides,
        ],
    )
    OUT.mkdir(parents=True, exist_ok=True)
    run = launch(variant, recipe, args, OUT / "packed_training_step_runner.log", timeout_s=900)
    result = {
        "family": "qwen35_35b_a3b",
        "variant": variant,
        "packing": packing,
        "overrides": overrides,
        "returncode": run.returncode,
        "nan_check_fired": "found NaN in local grad norm" in run.log,
        "losses": run.losses,
        "grad_norms": {it.step: it.grad_norm for it in run.iterations},
    }
    record(f"qwen35_35b_a3b/{variant}", result)
    assert run.returncode == 0 and not result["nan_check_fired"], result
    assert all(math.isfinite(v) for v in run.losses.values()) and len(run.losses) == RUNNER_STEPS, result
