"""The text recipes' forward step: Megatron-Bridge's own _forward_step_common runs (only the
batch is faked, on CPU), and the model receives the batch's loss mask when it has MTP, so the
MTP loss counts only supervised tokens; without MTP the call is Megatron-Bridge's unchanged."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

from bridge_recipes.training.train_step import forward_step


class _Group:
    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


class _Model(torch.nn.Module):
    """Stands where the DDP-wrapped GPT model stands; records what it was called with."""

    def __init__(self, mtp_layers):
        super().__init__()
        self.config = NS(mtp_num_layers=mtp_layers, seq_length=4, is_hybrid_model=False)
        self.pg_collection = NS(pp=_Group(), cp=_Group(), tp=_Group())
        self.calls: list[dict] = []

    def forward(self, **kwargs):
        self.calls.append(kwargs)
        return torch.zeros(1, 4)


class _Timer:
    """Megatron's timers and the straggler timer: callable, startable, and a context manager."""

    def __call__(self, *args, **kwargs):
        return self

    def start(self, *args, **kwargs):
        pass

    def stop(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _state(mtp_layers):
    rerun = NS(check_for_nan_in_loss=True, check_for_spiky_loss=False)
    model_cfg = NS(mtp_num_layers=mtp_layers, seq_length=4, virtual_pipeline_model_parallel_size=None)
    cfg = NS(model=model_cfg, rerun_state_machine=rerun, dataset=NS(skip_getting_attention_mask_from_dataset=True))
    return NS(cfg=cfg, timers=_Timer(), straggler_timer=_Timer(), train_state=NS())


@pytest.fixture
def fake_batch(monkeypatch):
    from megatron.bridge.training import gpt_step

    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])

    def get_batch(data_iterator, cfg, use_mtp=False, **kwargs):
        next(data_iterator)
        tokens = torch.arange(4)[None]
        return tokens, tokens + 1, mask, None, tokens.clone(), None

    monkeypatch.setattr(gpt_step, "get_batch", get_batch)
    monkeypatch.setattr(gpt_step, "accumulate_flops_metadata", lambda *a, **k: None)
    return mask


def test_the_model_gets_the_loss_mask_with_mtp(fake_batch):
    model = _Model(mtp_layers=1)
    state = _state(1)
    _, loss_func = forward_step(state, iter([{}]), model)
    (call,) = model.calls
    assert call["loss_mask"] is fake_batch and call["labels"].tolist() == [[1, 2, 3, 4]]
    assert loss_func.args[0] is fake_batch  # the LM loss keeps its own mask
    assert not model._forward_pre_hooks  # the hook is gone after the step
    forward_step(state, iter([{}]), model)
    assert len(model.calls) == 2 and model.calls[1]["loss_mask"] is fake_batch


def test_without_mtp_the_call_is_megatron_bridges(fake_batch):
    model = _Model(mtp_layers=None)
    forward_step(_state(None), iter([{}]), model)
    (call,) = model.calls
    assert "loss_mask" not in call


def test_the_forward_step_contract_it_relies_on():
    """The Megatron-Bridge internals the step calls, with the arguments it passes (a version of
    Megatron-Bridge without them fails here, not in a training run)."""
    import inspect

    from megatron.bridge.training import gpt_step

    params = inspect.signature(gpt_step._forward_step_common).parameters
    assert list(params)[:4] == ["state", "data_iterator", "model", "return_schedule_plan"]
    assert "_get_batch_fn" in params
    create = inspect.signature(gpt_step._create_loss_function).parameters
    assert list(create) == ["loss_mask", "check_for_nan_in_loss", "check_for_spiky_loss"]
