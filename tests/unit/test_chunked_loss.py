"""bridge_recipes.features.chunked_loss on a CPU: the loss and gradients a chunk at a time against an FP32
reference of the whole logits, what it keeps for the backward, and how it patches a model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from bridge_recipes.features import chunked_loss as C  # noqa: E402

P = C  # the feature module holds its patch too

TOKENS, HIDDEN, VOCAB = 300, 64, 1000  # 300 tokens in chunks of 128: two whole and one part


def inputs(dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(TOKENS, HIDDEN, generator=g) * 2).to(dtype)
    weight = (torch.randn(VOCAB, HIDDEN, generator=g) / HIDDEN**0.5).to(dtype)
    labels = torch.randint(0, VOCAB, (TOKENS,), generator=g)
    upstream = torch.rand(TOKENS, generator=g) * (torch.rand(TOKENS, generator=g) > 0.2)  # a loss mask's zeros
    return hidden, weight, labels, upstream


def reference(hidden, weight, labels, upstream):
    """The whole logits in FP32: per-token loss and the gradients of hidden and weight."""
    h = hidden.detach().float().requires_grad_()
    w = weight.detach().float().requires_grad_()
    loss = F.cross_entropy(h @ w.t(), labels, reduction="none")
    (loss * upstream).sum().backward()
    return loss.detach(), h.grad, w.grad


def rel(a, b):
    return float((a.detach().float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("train_weight", [False, True])
def test_the_loss_and_gradients_match_the_fp32_reference_of_the_whole_logits(train_weight):
    hidden, weight, labels, upstream = inputs()
    ref_loss, ref_dh, ref_dw = reference(hidden, weight, labels, upstream)
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_(train_weight)
    loss, preds = C.chunked_cross_entropy(h, w, labels, chunk=128)
    assert loss.dtype == torch.float32 and loss.shape == (TOKENS,)
    # each token's most likely class, from the BF16 logits as Megatron-Core's MTP count takes it
    with torch.no_grad():
        assert float((preds == (hidden @ weight.t()).argmax(-1)).float().mean()) > 0.99
    # the BF16 logits, as the output layer gives them, against FP32 products
    assert (loss - ref_loss).abs().max() < 0.05 and rel(loss, ref_loss) < 5e-3
    (loss * upstream).sum().backward()
    assert h.grad.dtype == torch.bfloat16 and rel(h.grad, ref_dh) < 2e-2
    if train_weight:
        assert rel(w.grad, ref_dw) < 2e-2
    else:
        assert w.grad is None
    # masked tokens get no gradient
    assert torch.all(h.grad[upstream == 0] == 0)


def test_chunks_do_not_change_the_result():
    """One chunk of every token against chunks of 128 and of 7: the same figures to rounding."""
    hidden, weight, labels, upstream = inputs(torch.float32)
    results = []
    for chunk in (TOKENS, 128, 7):
        h = hidden.clone().requires_grad_()
        loss, _ = C.chunked_cross_entropy(h, weight, labels, chunk=chunk)
        (loss * upstream).sum().backward()
        results.append((loss, h.grad))
    for loss, grad in results[1:]:
        torch.testing.assert_close(loss, results[0][0])
        torch.testing.assert_close(grad, results[0][1])


@pytest.mark.parametrize("train_weight", [False, True])
def test_it_keeps_no_tensor_of_the_vocabulary_a_token(train_weight):
    """What the loss saves for the backward: a frozen output layer, the hidden state's gradient per
    unit of loss ([tokens, hidden]); a trained one, its input and weight and a float a token."""
    hidden, weight, labels, _ = inputs()
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        C.chunked_cross_entropy(hidden.clone().requires_grad_(), weight.clone().requires_grad_(train_weight), labels)
    assert saved and all(VOCAB not in shape or shape == (VOCAB, HIDDEN) for shape in saved)
    expected = [(TOKENS, HIDDEN), (VOCAB, HIDDEN), (TOKENS,), (TOKENS,)] if train_weight else [(TOKENS, HIDDEN)]
    assert saved == expected


def test_a_trained_weight_under_megatrons_wrapper_sums_into_its_fp32_main_grad():
    hidden, weight, labels, upstream = inputs()
    _, _, ref_dw = reference(hidden, weight, labels, upstream)
    w = weight.clone().requires_grad_()
    w.main_grad = torch.full(w.shape, 1.0)  # an earlier micro batch's sum
    w.grad_added_to_main_grad = False
    (C.chunked_cross_entropy(hidden, w, labels, chunk=128)[0] * upstream).sum().backward()
    assert w.grad_added_to_main_grad and w.main_grad.dtype == torch.float32
    assert rel(w.main_grad - 1.0, ref_dw) < 2e-2


def test_chunk_tokens_follow_the_working_memory():
    assert C.chunk_tokens(248_320) == 1024  # 2 GiB / (8 bytes x 248,320) = 1,081, to a multiple of 128
    assert C.chunk_tokens(10**9) == 128
    assert C.chunk_tokens(1000) % 128 == 0 and C.chunk_tokens(1000) * 8 * 1000 <= C.CHUNK_BYTES


def test_its_config_switches_it_on_where_the_model_allows():
    one_rank = SimpleNamespace(tensor_model_parallel_size=1, use_mup=False)
    assert not C.Config().applies_to(one_rank)
    assert C.Config(enabled=True).applies_to(one_rank)
    assert not C.Config(enabled=True).applies_to(SimpleNamespace(tensor_model_parallel_size=2, use_mup=False))
    assert C.Config().chunk_tokens(248_320) == C.chunk_tokens(248_320)


# --- the patch on a model with Megatron-Core's language-model interface ---------------------------


class OutputLayer(torch.nn.Module):
    """Megatron-Core's ColumnParallelLinear's call on one rank: ``(input @ W.T, bias)``."""

    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, input_, weight=None, runtime_gather_output=None):
        return input_ @ (self.weight if weight is None else weight).t(), None


class TinyLM(torch.nn.Module):
    """A language model with GPTModel's loss path: an MTP-like second loss on other hidden states,
    then the main loss, both through ``output_layer`` and ``compute_language_model_loss``; logits
    ``[b, s, V]`` without labels."""

    def __init__(self, weight, tp=1):
        super().__init__()
        self.config = SimpleNamespace(tensor_model_parallel_size=tp, use_mup=False)
        self.post_process = True
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, dtype=weight.dtype)
        self.output_layer = OutputLayer(weight)

    def compute_language_model_loss(self, labels, logits):
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.t().flatten(), reduction="none")
        return loss.reshape(labels.t().shape).t().contiguous()

    def forward(self, hidden, labels=None):
        hidden = self.proj(hidden)  # [s, b, h]
        if labels is None:
            return self.output_layer(hidden)[0].transpose(0, 1)
        mtp_logits, _ = self.output_layer(torch.tanh(hidden), weight=self.output_layer.weight.detach())
        mtp = self.compute_language_model_loss(labels, mtp_logits)
        self.accepted = int((torch.argmax(mtp_logits, dim=-1) == labels.t()).sum())  # as MTP's count
        logits, _ = self.output_layer(hidden)
        return self.compute_language_model_loss(labels, logits) + 0.1 * mtp


def test_an_installed_model_gives_the_same_losses_and_gradients_and_logits_without_labels():
    hidden, weight, labels, _ = inputs(torch.float32)
    hidden, labels = hidden.reshape(100, 3, HIDDEN), labels.reshape(3, 100)  # [s, b, h] and [b, s]
    models = []
    for patched in (False, True):
        torch.manual_seed(0)
        model = TinyLM(weight)
        if patched:
            assert P.pre_wrap_hook([model]) == [model]
        loss = model(hidden, labels=labels)
        loss.sum().backward()
        models.append((model, loss))
    (plain, plain_loss), (chunked, chunked_loss) = models
    assert chunked_loss.shape == (3, 100)
    torch.testing.assert_close(chunked_loss, plain_loss)
    torch.testing.assert_close(chunked.proj.weight.grad, plain.proj.weight.grad)
    assert chunked.accepted == plain.accepted
    # without labels the model returns its logits, as before
    with torch.no_grad():
        torch.testing.assert_close(chunked(hidden), plain(hidden))
    assert P.install_on(chunked)  # installing twice changes nothing
    torch.testing.assert_close(chunked(hidden, labels=labels), chunked_loss, rtol=0, atol=0, check_dtype=True)


def test_deferred_logits_refuse_any_use_but_the_predictions_by_name():
    _, weight, _, _ = inputs(torch.float32)
    deferred = C.DeferredLogits(torch.zeros(4, 1, HIDDEN), weight)
    with pytest.raises(RuntimeError, match="before its loss"):
        torch.argmax(deferred, dim=-1)
    deferred.preds = torch.zeros(4, 1, dtype=torch.long)
    assert torch.argmax(deferred, dim=-1) is deferred.preds
    with pytest.raises(TypeError, match=f"softmax on the logits.*{C.KEY}=false"):
        torch.softmax(deferred, dim=-1)


def test_a_model_it_cannot_serve_is_named():
    _, weight, _, _ = inputs(torch.float32)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2"):
        P.install_on(TinyLM(weight, tp=2))
    stage = TinyLM(weight)
    stage.post_process = False  # not the last pipeline stage: nothing to change
    assert not P.install_on(stage)
    assert "use_mup" in C.problem(SimpleNamespace(tensor_model_parallel_size=1, use_mup=True))


# --- switched on by a recipe's features ----------------------------------------------------------

FAST_35B = "qwen35_35b_a3b_peft_1gpu_h200_bf16_config"
ON = f"{C.KEY}=true"


def test_the_planner_counts_one_chunk_of_logits_instead_of_the_whole(monkeypatch):
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    whole = plan_memory(bridge_recipes.build(FAST_35B), 1, gpu="h200")
    chunked = plan_memory(bridge_recipes.build(FAST_35B, overrides=[ON]), 1, gpu="h200")
    (w,), (c,) = whole.stages, chunked.stages
    vocab = 248_320
    assert w.logits_gb > 40  # 32,768 tokens: the MTP loss's kept copy, the main loss's logits and copy
    assert c.logits_gb == pytest.approx(C.chunk_tokens(vocab) * vocab * 8 / 1e9, rel=0.01)
    # the backward's working set is then the larger, with the first step's retained layer before the
    # optimizer's moments exist; nothing else changes
    assert w.first_step_retained_gb == 0 < c.first_step_retained_gb
    assert c.backward_gb > c.logits_gb and c.allocated_gb == pytest.approx(
        w.allocated_gb - w.logits_gb + c.backward_gb + max(0.0, c.first_step_retained_gb - c.moments_gb)
    )


def test_the_runner_checks_and_installs_it_from_the_config():
    import bridge_recipes
    from bridge_recipes.runner import checks

    cfg = bridge_recipes.build(FAST_35B, overrides=[ON])
    assert C.problems(cfg) == []
    assert P.wanted(cfg)
    assert f"{C.KEY}=true" in P.install(cfg)
    P.install(cfg)  # once
    assert cfg.model._pre_wrap_hooks.count(P.pre_wrap_hook) == 1
    _, weight, _, _ = inputs(torch.float32)
    model = TinyLM(weight)
    cfg.model.pre_wrap_hook([model])
    assert getattr(model, C._ACTIVE) is False  # installed, idle until a call with labels
    cfg.model.tensor_model_parallel_size = 2
    (msg,) = C.problems(cfg)
    assert "model.tensor_model_parallel_size=2" in msg and f"{C.KEY}=false" in msg
    assert any("tensor_model_parallel_size=2" in p.message for p in checks.check(cfg, 2))
    off = bridge_recipes.build(FAST_35B)
    assert C.problems(off) == [] and not P.wanted(off)
