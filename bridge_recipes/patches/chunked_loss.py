"""A Megatron-Core language model's ``output_layer.forward`` and ``compute_language_model_loss``,
replaced on the model instance, compute the loss a chunk of tokens at a time
(``bridge_recipes.chunked_loss`` holds the loss); a pre-wrap hook does it for the chunks
Megatron-Bridge builds."""

from __future__ import annotations

import types
from typing import Any

from bridge_recipes import chunked_loss
from bridge_recipes.patches.contract import Patch, check, register_pre_wrap_hook_once


def wanted(cfg: Any, **run: Any) -> bool:
    """The environment (``BRIDGE_RECIPES_CHUNKED_LOSS``) switches it on, for a text model."""
    from bridge_recipes.common import is_vlm

    return not is_vlm(cfg) and chunked_loss.enabled(cfg.env_vars)


def install_on(model: Any) -> bool:
    """Compute ``model``'s language-model (and MTP) losses a chunk of tokens at a time. True when
    installed; False for a model without an output layer (not the last pipeline stage)."""
    output_layer = getattr(model, "output_layer", None)
    if output_layer is None or not getattr(model, "post_process", True):
        return False
    if getattr(model, chunked_loss._ACTIVE, None) is not None:
        return True
    if why := chunked_loss.problem(model.config):
        raise ValueError(why)
    original_forward = output_layer.forward
    original_loss = model.compute_language_model_loss

    def forward(self, input_, weight=None, runtime_gather_output=None):
        if not getattr(model, chunked_loss._ACTIVE, False):
            return original_forward(input_, weight=weight, runtime_gather_output=runtime_gather_output)
        return chunked_loss.DeferredLogits(input_, self.weight if weight is None else weight), None

    def compute_language_model_loss(self, labels, logits):
        if not isinstance(logits, chunked_loss.DeferredLogits):
            return original_loss(labels, logits)
        hidden = logits.hidden  # [s, b, h]
        s, b, h = hidden.shape
        per_token, preds = chunked_loss.chunked_cross_entropy(
            hidden.reshape(s * b, h), logits.weight, labels.t().reshape(s * b)
        )
        logits.preds = preds.reshape(s, b)
        return per_token.reshape(s, b).t().contiguous()  # [b, s], as Megatron-Core's

    def before(module, args, kwargs):
        setattr(module, chunked_loss._ACTIVE, kwargs.get("labels") is not None)

    def after(module, args, kwargs, output):
        setattr(module, chunked_loss._ACTIVE, False)

    output_layer.forward = types.MethodType(forward, output_layer)
    model.compute_language_model_loss = types.MethodType(compute_language_model_loss, model)
    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)
    setattr(model, chunked_loss._ACTIVE, False)
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
        f"loss: the output layer and cross entropy {chunked_loss.chunk_tokens(vocab) if vocab else 'a chunk'} "
        f"tokens at a time ({chunked_loss.ENV}=1; bridge_recipes.chunked_loss)"
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
)
