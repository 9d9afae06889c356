"""LoRA adapters' gradients against an FP32 reference: the recipes' adapters on a bare model, and the
figures a case records (the GPU tests ``lab/tests/gpu/test_fp8_base_parity.py`` and
``lab/tests/gpu/test_fused_lora_parity.py``).

The noise floor of a case is the error of the plain BF16 path against FP32; a path under test is judged
by its loss's relative error and its adapters' gradient error beside that floor."""

from __future__ import annotations

from typing import Any


def rel(a, b) -> float:
    """Relative norm of the difference ``a - b`` against ``b``."""
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def with_lora(model):
    """The recipes' LoRA (rank 32, alpha 32 on common.LORA_TARGETS) on ``model``, both adapter matrices
    random (B is zero at init, which would leave A without a gradient)."""
    import torch
    from megatron.bridge.peft.lora import LoRA

    from bridge_recipes.recipes.base import LORA_TARGETS

    model = LoRA(target_modules=list(LORA_TARGETS), dim=32, alpha=32)(model, training=True)
    with torch.no_grad():
        gen = torch.Generator(device="cuda").manual_seed(7)
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen, device="cuda", dtype=torch.float32).to(p.dtype) * 0.02)
    return model


def adapter_vector(grads: dict):
    """The adapters' gradients, one flat vector in name order."""
    import torch

    return torch.cat([grads[n].flatten() for n in sorted(grads)])


def against_fp32(
    ref: tuple[float, dict], path: tuple[float, dict], floor: tuple[float, dict], floor_name: str
) -> dict[str, Any]:
    """A path's (loss, adapter gradients) against the FP32 reference's, with the BF16 path's as the noise
    floor: ``loss_rel_err``, ``loss_rel_err_<floor_name>``, ``adapter_grad_err``, ``noise_floor`` and
    ``adapter_grad_cosine``."""
    import torch

    ref_loss, r = ref[0], adapter_vector(ref[1])
    grads = adapter_vector(path[1])
    return {
        "loss_rel_err": abs(path[0] - ref_loss) / abs(ref_loss),
        f"loss_rel_err_{floor_name}": abs(floor[0] - ref_loss) / abs(ref_loss),
        "adapter_grad_err": rel(grads, r),
        "noise_floor": rel(adapter_vector(floor[1]), r),
        "adapter_grad_cosine": float(torch.nn.functional.cosine_similarity(grads, r, dim=0)),
    }
