"""The forward step the text recipes train with: Megatron-Bridge's ``gpt_step.forward_step``, with
the loss mask also handed to the model, so the multi-token-prediction (MTP) loss counts only the
supervised tokens.

Megatron-Bridge 0.6.2's ``gpt_step`` calls the model with tokens, positions, labels and the
packed-sequence parameters but not the loss mask, and masks only the language-model loss
afterwards. Megatron-Core's ``process_mtp_loss`` then falls back to a mask of ones: the MTP head
(Qwen3.5/3.6 carry one, used for speculative decoding) trains on every position of an SFT row,
system, user and tool turns and padding included, and with the per-token loss its gradient is
scaled by all the row's tokens over the supervised ones. Both are reported against Megatron-Bridge
(issue 6103, "gpt_step does not pass loss_mask to the model, so the MTP loss (and its gradient) is
computed over padding"). Megatron-LM's own ``pretrain_gpt.py`` passes the mask, which is what this
step does: the batch's mask (label-aligned, the one the LM loss uses, already sliced for context
parallelism) goes to the model as ``loss_mask``, and Megatron-Core rolls it with the MTP labels,
conversation by conversation in packed rows. The LM loss is unchanged.

Models without MTP, and the schedule-plan path (which already passes the mask), take
Megatron-Bridge's step as it is; the VL recipes' ``vlm_step`` passes the mask itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def forward_step(
    state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False
) -> tuple[Any, Callable]:
    """``gpt_step.forward_step`` with ``loss_mask`` passed to the model (see the module docstring)."""
    from megatron.bridge.training import gpt_step

    if return_schedule_plan or not (getattr(state.cfg.model, "mtp_num_layers", None) or 0):
        return gpt_step.forward_step(state, data_iterator, model, return_schedule_plan)

    masks: list[Any] = []

    def get_batch(*args: Any, **kwargs: Any):
        batch = gpt_step.get_batch(*args, **kwargs)
        masks.append(batch[2])  # (tokens, labels, loss_mask, attention_mask, position_ids, packed)
        return batch

    def with_loss_mask(_module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        # Only where the model computes losses (labels given: the last pipeline stage).
        if kwargs.get("labels") is not None and kwargs.get("loss_mask") is None and masks and masks[-1] is not None:
            kwargs = {**kwargs, "loss_mask": masks[-1]}
        return args, kwargs

    handle = model.register_forward_pre_hook(with_loss_mask, with_kwargs=True)
    try:
        output, loss_mask = gpt_step._forward_step_common(
            state, data_iterator, model, return_schedule_plan, _get_batch_fn=get_batch
        )
    finally:
        handle.remove()
    rerun = state.cfg.rerun_state_machine
    return output, gpt_step._create_loss_function(
        loss_mask,
        check_for_nan_in_loss=rerun.check_for_nan_in_loss,
        check_for_spiky_loss=rerun.check_for_spiky_loss,
    )
