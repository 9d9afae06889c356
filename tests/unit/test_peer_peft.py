"""The transformers + PEFT peer of the one-GPU LoRA recipes on a CPU: a toy of the recipe's model
trains on packed rows and writes its figures; the adapters sit where the recipe's do, with its rank
and alpha; a packed row's conversations see only themselves; the full-size models and adapters
build on the meta device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bridge_recipes
from bridge_recipes.bench import lora_vs_peft, peer_peft
from bridge_recipes.common import LORA_TARGETS
from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.data.synthetic_chat import conversations_jsonl

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
MOE = "qwen35_35b_a3b_peft_1gpu_h200_bf16_config"
DENSE = "qwen35_27b_peft_1gpu_h200_bf16_config"
ROW_TOKENS = 2048
# a few layers (the real Gated DeltaNet / attention pattern), small widths, the fixture's vocabulary
TOY = dict(
    num_layers=4,
    hidden_size=64,
    num_attention_heads=4,
    num_query_groups=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    vocab_size=1024,
)
TOY_MOE = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_shared_expert_ffn_hidden_size=32)
TOY_DENSE = dict(ffn_hidden_size=128)
ROWS_OVERRIDES = [f"model.seq_length={ROW_TOKENS}", f"dataset.seq_length={ROW_TOKENS}", "train.global_batch_size=2"]


def size_args(**sizes) -> list[str]:
    return [a for k, v in sizes.items() for a in ("--size", f"{k}={v}")]


TOY_ARGS = {MOE: size_args(**TOY, **TOY_MOE), DENSE: size_args(**TOY, **TOY_DENSE)}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The toys' matrices are small: one thread each, so a shared CPU does not thrash."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def allocator_setting_restored(monkeypatch):
    """The peer sets the recipe's PYTORCH_CUDA_ALLOC_CONF in its process (here, the test's) when unset."""
    monkeypatch.setenv(peer_peft.ALLOCATOR, "unset")
    monkeypatch.delenv(peer_peft.ALLOCATOR)  # restored to what it was after the test


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("peer_rows")
    (tmp / "c.jsonl").write_text(conversations_jsonl(40))
    build_sft_rows(tmp / "c.jsonl", TOKENIZER, tmp / "rows", row_tokens=ROW_TOKENS, progress=False)
    return tmp / "rows"


def toy_workload(recipe: str, rows: Path, *overrides: str):
    cfg = peer_peft.workload_config(recipe, rows, [*ROWS_OVERRIDES, *overrides])
    sizes = {**TOY, **(TOY_MOE if recipe == MOE else TOY_DENSE)}
    return cfg, peer_peft.model_spec(cfg, sizes)


def test_a_toy_of_the_moe_recipe_trains_on_packed_rows_and_writes_its_figures(rows, tmp_path, capsys):
    out = tmp_path / "peer.json"
    argv = ["--recipe", MOE, "--rows", str(rows), "--steps", "3", "--window", "2", "3", "--out", str(out)]
    assert peer_peft.main([*argv, *TOY_ARGS[MOE], *ROWS_OVERRIDES]) == 0
    doc = json.loads(out.read_text())
    assert doc["model"] == "qwen35_35b_a3b" and doc["recipe"] == MOE
    assert doc["workload"]["row_tokens"] == ROW_TOKENS and doc["workload"]["global_batch"] == 2
    assert doc["workload"]["rows"]["packing"] == "boundaries"
    r = doc["result"]
    window_s = sum(s["time_s"] for s in doc["steps"][1:])
    assert r["tokens_per_s"] == pytest.approx(2 * 2 * ROW_TOKENS / window_s, rel=1e-3)
    assert r["useful_tokens_per_s"] < r["tokens_per_s"] and r["peak_allocated_gb"] is None  # no GPU here
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3] and all(0 < s["loss"] < 10 for s in doc["steps"])
    every = {m for t in LORA_TARGETS for m in peer_peft.HF_TARGETS[t]} | {"experts.gate_up_proj", "experts.down_proj"}
    assert set(doc["lora"]["modules"]) == every and doc["lora"]["rank"] == 32
    stack = doc["stack"]
    assert stack["gradient_checkpointing"] and stack["adapter_dtype"] == "float32"
    assert stack["allocator"] == bridge_recipes.build(MOE).env_vars[peer_peft.ALLOCATOR]  # the recipe's
    assert not stack["gdn_kernel"].startswith(peer_peft.FLA)  # flash-linear-attention runs on GPUs only
    assert "PEFT" in doc["peer_stack"] and stack["attention"] in doc["peer_stack"]
    assert "step 3/3" in capsys.readouterr().out


def test_training_moves_the_adapters_and_leaves_the_base_weights(rows):
    import torch

    from bridge_recipes.data.packed_rows import PackedRowsDataset

    cfg, spec = toy_workload(MOE, rows)
    model = peer_peft.add_adapters(peer_peft.build_model(spec, "cpu", "sdpa", True), cfg.peft, spec.is_moe)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = PackedRowsDataset(rows, ROW_TOKENS, 4, vocab_size=spec.vocab_size)
    records = peer_peft.train(model, data, steps=2, global_batch=2, optimizer_cfg=cfg.optimizer, device="cpu")
    assert [r["tokens"] for r in records] == [2 * ROW_TOKENS] * 2
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert moved and moved <= trainable and all(".lora_" in n for n in trainable)
    assert any("experts" in n for n in moved)  # the routed experts' adapters train too


def test_the_adapters_follow_the_recipes_lora(rows):
    cfg, spec = toy_workload(DENSE, rows, "peft.dim=8", "peft.alpha=16")
    model = peer_peft.add_adapters(peer_peft.build_model(spec, "meta", "sdpa", False), cfg.peft, spec.is_moe)
    layer = model.base_model.model.model.layers[0].linear_attn.in_proj_z
    assert layer.lora_A["default"].weight.shape[0] == 8 and layer.scaling["default"] == 2.0
    assert "experts.gate_up_proj" not in peer_peft.adapted_names(model)  # a dense model has none
    cfg.peft.target_modules = [*cfg.peft.target_modules, "router"]
    with pytest.raises(peer_peft.PeerError, match="router"):
        peer_peft.lora_config(cfg.peft, moe=False)


def test_a_packed_rows_conversations_see_only_themselves(rows):
    """Attention through the position ids the peer passes: each conversation of a packed row gives
    the logits it gives alone (every layer attention here: on a CPU transformers' Gated DeltaNet
    is its PyTorch reference, which takes no boundaries); the boundaries reach the Gated DeltaNet
    kernel as its cu_seqlens."""
    import torch

    from bridge_recipes.data.packed_rows import PackedRowsDataset

    cfg, spec = toy_workload(DENSE, rows, "peft.dim=8")
    data = PackedRowsDataset(rows, ROW_TOKENS, 1, vocab_size=spec.vocab_size)
    sample = data[0]
    cu = sample["cu_seqlens_q"].tolist()
    assert len(cu) > 3  # a few conversations (and the padding) in the row
    attention = peer_peft.build_model(
        peer_peft.dataclasses.replace(spec, full_attention_interval=1), "cpu", "sdpa", False
    ).float()
    kwargs, _, _ = peer_peft.micro_batch(sample, "cpu")
    with torch.no_grad():
        packed = attention(**kwargs).logits[0]
        for a, b in zip(cu[:2], cu[1:3]):
            alone = attention(input_ids=sample["tokens"][None, a:b]).logits[0]
            assert torch.allclose(packed[a:b], alone, atol=1e-4), (a, b)
    seen = []
    gdn = peer_peft.build_model(spec, "cpu", "sdpa", False)
    for module in gdn.modules():
        if type(module).__name__.endswith("GatedDeltaNet"):
            kernel = module.chunk_gated_delta_rule
            module.chunk_gated_delta_rule = lambda *a, _k=kernel, **kw: seen.append(kw["cu_seqlens"]) or _k(*a, **kw)
    with torch.no_grad():
        gdn(**kwargs)
    assert len(seen) == spec.num_gdn_layers and all(s.tolist() == cu for s in seen)


def test_the_gated_deltanet_kernel_is_found_behind_a_wrapper():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    def reference(*args, **kwargs):
        raise AssertionError

    def choose(implementation):  # a wrapper that picked its implementation once, as later transformers do
        def wrapped(*args, **kwargs):
            return implementation(*args, **kwargs)

        return wrapped

    assert peer_peft._called_module(choose(chunk_gated_delta_rule)).startswith(peer_peft.FLA)
    assert peer_peft._called_module(choose(reference)) == __name__


@pytest.mark.parametrize("recipe", lora_vs_peft.RECIPES)
def test_full_size_model_and_adapters_build_on_the_meta_device(recipe, rows, capsys):
    """Every layer, expert and vocabulary row, adapters on each target; rows of the toy length stand in."""
    argv = ["--recipe", recipe, "--rows", str(rows), "--dry-run", f"model.seq_length={ROW_TOKENS}"]
    assert peer_peft.main([*argv, f"dataset.seq_length={ROW_TOKENS}"]) == 0
    out = capsys.readouterr().out
    spec = peer_peft.model_spec(peer_peft.workload_config(recipe, rows, ROWS_OVERRIDES))
    assert f"{spec.num_layers} layers" in out and "vocabulary 248320" in out
    assert ("experts.gate_up_proj" in out) == spec.is_moe and "in_proj_qkv" in out


def test_bad_input_exits_2_naming_it(rows, tmp_path, capsys):
    out = str(tmp_path / "p.json")
    base = ["--rows", str(rows), "--out", out, *ROWS_OVERRIDES]
    cases = [
        (["--recipe", "qwen35_27b_sft_8gpu_h200_bf16_config", *base], "not a LoRA recipe"),
        (["--recipe", DENSE, *base, "--size", "layers=4"], "--size layers"),
        (["--recipe", DENSE, *base, "--size", "num_layers=four"], "--size num_layers=four"),
        (["--recipe", DENSE, *base[:-3]], "seq_length"),  # 8,192-token model, 2,048-token rows
    ]
    for argv, named in cases:
        assert peer_peft.main(argv) == 2, argv
        assert named in capsys.readouterr().err
    for argv, named in (
        (["--recipe", DENSE, "--rows", str(rows), "--steps", "3"], "--out"),
        (["--recipe", DENSE, *base, "--steps", "3", "--window", "2", "5"], "--window"),
    ):
        with pytest.raises(SystemExit) as exc:
            peer_peft.main(argv)
        assert exc.value.code == 2 and named in capsys.readouterr().err
    assert not Path(out).exists()


def test_a_run_out_of_memory_writes_its_error_and_exits_1(rows, tmp_path, monkeypatch):
    import torch

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(peer_peft, "train", out_of_memory)
    out = tmp_path / "peer.json"
    argv = ["--recipe", DENSE, "--rows", str(rows), "--steps", "2", "--window", "1", "2", "--out", str(out)]
    assert peer_peft.main([*argv, *TOY_ARGS[DENSE], *ROWS_OVERRIDES]) == 1
    doc = json.loads(out.read_text())
    assert doc["result"] is None and "out of memory" in doc["error"] and doc["peer_stack"]
