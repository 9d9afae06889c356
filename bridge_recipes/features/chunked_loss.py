"""The language-model loss over chunks of tokens, without the whole sequence's logits.

Megatron-Core computes a loss as the output layer's logits, ``[tokens, vocabulary]``, then the cross
entropy over them. With the family's 248K vocabulary that is the largest tensor of a long micro
batch (32,768 tokens: 16 GB of BF16 logits, and a copy per loss with the fused kernels; the MTP head
adds a loss). Here the output layer's product and the cross entropy run a chunk of tokens at a
time (:data:`CHUNK_BYTES` of working memory), keeping per token only the log-sum-exp or, for a
frozen output layer, the hidden state's gradient per unit of loss.

That gradient is exact to precompute: a token's loss depends on its own logits alone, so the
gradient of the hidden state is the upstream gradient of that token's loss times
``(softmax - onehot) @ W``, computed in the forward from the same logits. A trained output layer
needs the upstream gradient in its weight's sum, so its backward recomputes each chunk's logits
(one more output-layer GEMM).

:data:`PATCH` changes one Megatron-Core language model in place (its ``output_layer`` and
``compute_language_model_loss``), through a pre-wrap hook for the model chunks Megatron-Bridge builds.
It applies on one tensor-parallel rank only (the vocabulary whole on the rank), without MuP's output
scaling and to text models; :func:`problem` names what stops it. ``features.chunked_loss.enabled``
switches it on (:class:`Config`; the recipes' block is
:func:`bridge_recipes.recipes.qwen.policy.chunked_cross_entropy`).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from bridge_recipes.patches.contract import Patch, check, register_pre_wrap_hook_once

KEY = "features.chunked_loss.enabled"
REPLACES_ENV = ("BRIDGE_RECIPES_CHUNKED_LOSS", KEY)  # the environment variable this key replaced
CHUNK_BYTES = 2**31  # working memory of one chunk: its BF16 logits, their FP32 copy and gradient
_ACTIVE = "_chunked_loss_active"  # set on the model while a call with labels runs


@dataclass
class Config:
    """The output layer and the cross entropy a chunk of tokens at a time (``enabled``)."""

    enabled: bool = False

    def applies_to(self, model_cfg: Any) -> bool:
        """Switched on, and nothing of ``model_cfg`` stops it (the planner's question)."""
        return self.enabled and problem(model_cfg) is None

    def chunk_tokens(self, vocab: int) -> int:
        """Tokens per chunk for a vocabulary of ``vocab`` (:func:`chunk_tokens`)."""
        return chunk_tokens(vocab)


def chunk_tokens(vocab: int) -> int:
    """Tokens per chunk: :data:`CHUNK_BYTES` over 8 bytes per logit (BF16 logit, FP32 copy, BF16
    gradient), a multiple of 128, at least 128."""
    return max(128, CHUNK_BYTES // (8 * vocab) // 128 * 128)


def problems(cfg: Any) -> list[str]:
    """What stops the chunked loss a config switches on: a VL model, tensor parallelism, MuP; each with
    the fix."""
    from bridge_recipes.models.qwen35 import is_vlm

    if not cfg.features.chunked_loss.enabled:
        return []
    fix = f"or set {KEY}=false"
    if is_vlm(cfg):
        return [f"{KEY}=true applies to the text models only; {fix}"]
    why = problem(cfg.model)
    return [f"{why}; {fix}"] if why else []


def problem(model_cfg: Any) -> str | None:
    """Why the chunked loss cannot apply to a model of ``model_cfg``, or None."""
    if (getattr(model_cfg, "tensor_model_parallel_size", 1) or 1) > 1:
        return (
            f"model.tensor_model_parallel_size={model_cfg.tensor_model_parallel_size}: the chunked loss needs "
            "the whole vocabulary on one rank (tensor parallel size 1)"
        )
    if getattr(model_cfg, "use_mup", False):
        return "model.use_mup=true: the chunked loss does not apply MuP's output scaling"
    return None


def _function():
    import torch

    class ChunkedLinearCrossEntropy(torch.autograd.Function):
        """Per-token cross entropy of ``hidden @ weight.T`` against ``labels``, ``chunk`` tokens at a time."""

        @staticmethod
        def forward(ctx, hidden, weight, labels, chunk: int):
            n = hidden.shape[0]
            loss = torch.empty(n, dtype=torch.float32, device=hidden.device)
            preds = torch.empty(n, dtype=torch.long, device=hidden.device)
            keep_dh = hidden.requires_grad and not weight.requires_grad
            # kept for the backward: the hidden state's gradient a unit of loss, or the log-sum-exp
            kept = torch.empty_like(hidden) if keep_dh else torch.empty(n, dtype=torch.float32, device=hidden.device)
            for start in range(0, n, chunk):
                end = min(n, start + chunk)
                low = hidden[start:end] @ weight.t()
                preds[start:end] = low.argmax(dim=-1)  # MTP's acceptance count reads the predictions
                logits = low.float()
                del low
                part_lse = torch.logsumexp(logits, dim=-1)
                target = labels[start:end].unsqueeze(1)
                loss[start:end] = part_lse - logits.gather(1, target).squeeze(1)
                if keep_dh:
                    kept[start:end] = _unit_gradient(logits, part_lse, target).to(hidden.dtype) @ weight
                else:
                    kept[start:end] = part_lse
                del logits
            ctx.chunk = chunk
            if keep_dh:
                ctx.save_for_backward(kept)
            else:
                ctx.save_for_backward(hidden, weight, labels, kept)
            ctx.keep_dh = keep_dh
            ctx.mark_non_differentiable(preds)
            return loss, preds

        @staticmethod
        def backward(ctx, grad_loss, _grad_preds):
            if ctx.keep_dh:
                (dh,) = ctx.saved_tensors
                return (dh.float() * grad_loss.unsqueeze(1)).to(dh.dtype), None, None, None
            hidden, weight, labels, lse = ctx.saved_tensors
            dhidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
            dweight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
            for start in range(0, hidden.shape[0], ctx.chunk):
                end = min(hidden.shape[0], start + ctx.chunk)
                logits = (hidden[start:end] @ weight.t()).float()
                grad = _unit_gradient(logits, lse[start:end], labels[start:end].unsqueeze(1))
                grad = (grad * grad_loss[start:end].unsqueeze(1)).to(hidden.dtype)
                if dhidden is not None:
                    dhidden[start:end] = grad @ weight
                if dweight is not None:
                    dweight += (grad.t() @ hidden[start:end]).float()
            return dhidden, _weight_grad(weight, dweight), None, None

    return ChunkedLinearCrossEntropy


def _unit_gradient(logits, lse, target):
    """The loss's gradient by the FP32 ``logits`` ``[c, V]`` a unit of loss, ``softmax - onehot``,
    in place of the logits (``lse``: their log-sum-exp, ``target``: ``[c, 1]`` labels)."""
    import torch

    grad = logits.sub_(lse.unsqueeze(1)).exp_()
    return grad.scatter_add_(1, target, torch.full_like(target, -1.0, dtype=grad.dtype))


def _weight_grad(weight, dweight):
    """The weight's gradient for autograd. Under Megatron-Core's data parallel wrapper (a ``main_grad``
    buffer) the FP32 sum goes straight into the buffer and autograd gets a placeholder, as Megatron's
    own linear layers do with gradient-accumulation fusion, so no BF16 rounding comes between."""
    import torch

    if dweight is None:
        return None
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None or not hasattr(weight, "grad_added_to_main_grad"):
        return dweight.to(weight.dtype)
    main_grad.add_(dweight)
    weight.grad_added_to_main_grad = True
    return torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)


_FN: list[Any] = []


def chunked_cross_entropy(hidden, weight, labels, chunk: int | None = None):
    """Per-token loss of ``hidden`` ``[tokens, h]`` through ``weight`` ``[vocabulary, h]`` against
    ``labels`` ``[tokens]``, in FP32, as ``cross_entropy(hidden @ weight.T, labels, reduction='none')``,
    and each token's most likely class (``argmax`` of its logits)."""
    if not _FN:
        _FN.append(_function())
    return _FN[0].apply(hidden, weight, labels, chunk or chunk_tokens(weight.shape[0]))


class DeferredLogits:
    """What the output layer returns while a loss follows: its input and weight, for the loss to
    take a chunk at a time. After the loss, ``torch.argmax(logits, dim=-1)`` gives the predictions
    the loss found (Megatron-Core's MTP acceptance count asks for them); any other use of the logits
    is refused by name."""

    def __init__(self, hidden, weight):
        self.hidden, self.weight = hidden, weight
        self.preds = None  # [s, b], set by the loss

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        import torch

        kwargs = kwargs or {}
        this = args[0] if args else None
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if func in (torch.argmax, torch.Tensor.argmax) and isinstance(this, cls) and dim in (-1, 2):
            if this.preds is None:
                raise RuntimeError("the chunked loss has no predictions before its loss is computed")
            return this.preds
        name = getattr(func, "__name__", str(func))
        raise TypeError(
            f"{name} on the logits: the loss a chunk at a time ({KEY}=true) keeps none; set {KEY}=false for this model"
        )


def wanted(cfg: Any, **run: Any) -> bool:
    """``features.chunked_loss.enabled``, for a text model."""
    from bridge_recipes.models.qwen35 import is_vlm

    return not is_vlm(cfg) and cfg.features.chunked_loss.enabled


def install_on(model: Any) -> bool:
    """Compute ``model``'s language-model (and MTP) losses a chunk of tokens at a time. True when
    installed; False for a model without an output layer (not the last pipeline stage)."""
    output_layer = getattr(model, "output_layer", None)
    if output_layer is None or not getattr(model, "post_process", True):
        return False
    if getattr(model, _ACTIVE, None) is not None:
        return True
    if why := problem(model.config):
        raise ValueError(why)
    original_forward = output_layer.forward
    original_loss = model.compute_language_model_loss

    def forward(self, input_, weight=None, runtime_gather_output=None):
        if not getattr(model, _ACTIVE, False):
            return original_forward(input_, weight=weight, runtime_gather_output=runtime_gather_output)
        return DeferredLogits(input_, self.weight if weight is None else weight), None

    def compute_language_model_loss(self, labels, logits):
        if not isinstance(logits, DeferredLogits):
            return original_loss(labels, logits)
        hidden = logits.hidden  # [s, b, h]
        s, b, h = hidden.shape
        per_token, preds = chunked_cross_entropy(hidden.reshape(s * b, h), logits.weight, labels.t().reshape(s * b))
        logits.preds = preds.reshape(s, b)
        return per_token.reshape(s, b).t().contiguous()  # [b, s], as Megatron-Core's

    def before(module, args, kwargs):
        setattr(module, _ACTIVE, kwargs.get("labels") is not None)

    def after(module, args, kwargs, output):
        setattr(module, _ACTIVE, False)

    output_layer.forward = types.MethodType(forward, output_layer)
    model.compute_language_model_loss = types.MethodType(compute_language_model_loss, model)
    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)
    setattr(model, _ACTIVE, False)
    return True


def pre_wrap_hook(chunks: list) -> list:
    """Megatron-Bridge pre-wrap hook: :func:`install_on` each model chunk that has the output layer."""
    for chunk in chunks:
        install_on(chunk)
    return chunks


def install(cfg: Any) -> str:
    """Register :func:`pre_wrap_hook` on ``cfg.model`` (once)."""
    check(PATCH)
    register_pre_wrap_hook_once(cfg, pre_wrap_hook)
    vocab = cfg.model.vocab_size or 0
    return (
        f"loss: the output layer and cross entropy {chunk_tokens(vocab) if vocab else 'a chunk'} "
        f"tokens at a time ({KEY}=true)"
    )


PATCH = Patch(
    name="chunked_loss",
    what="the output layer and cross entropy a chunk of tokens at a time, never the whole logits",
    written_for={"megatron-core": ">=0.19,<0.20", "megatron-bridge": ">=0.6,<0.7"},
    targets={
        "megatron.core.models.common.language_module.language_module.LanguageModule.compute_language_model_loss": (
            "self",
            "labels",
            "logits",
        ),
        "megatron.core.tensor_parallel.layers.ColumnParallelLinear.forward": (
            "self",
            "input_",
            "weight",
            "runtime_gather_output",
        ),
        "megatron.bridge.models.model_provider.ModelProviderMixin.register_pre_wrap_hook": ("self", "hook", "prepend"),
    },
    install=install,
    wanted=wanted,
    module=__name__,
)
