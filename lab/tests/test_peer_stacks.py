"""The peer's configurations on a CPU.

Liger's path: its model patches and its fused linear cross entropy (injected: Triton does not run
here) get the causal LM, its last hidden states, the output layer's weight and the rows' masked
labels, and the loss per supervised token is the plain peer's. A configuration whose packages do
not import is recorded as not installed (exit 3, its result file says so), not as a failure. The
causal-conv1d convolution, where installed, gets each token's conversation. The comparison tries
the configurations in order until one runs, records each one tried, names the best that ran, and
refuses a memory cap that ours is planned not to fit, naming the recipes that do."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from lab import lora_vs_peft, peer_peft
from lab.tests import test_lora_vs_peft as base

DENSE, MOE, TOY = base.DENSE, base.MOE, base.TOY
ROWS_OVERRIDES, SHORT_ROWS = base.ROWS_OVERRIDES, base.SHORT_ROWS
fake_launches = base.fake_launches
# the comparison's fixtures: packed 2,048-token rows, one thread, the allocator setting restored
short_rows, one_thread, allocator_setting_restored = base.short_rows, base.one_thread, base.allocator_setting_restored

L40S_35B = "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config"
H100_35B = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"


def toy_argv(recipe: str, rows: Path, out: Path, *extra: str) -> list[str]:
    argv = ["--recipe", recipe, "--rows", str(rows), "--steps", "2", "--window", "1", "2", "--out", str(out)]
    return [*argv, *peer_peft.size_args(TOY[recipe]), *ROWS_OVERRIDES, *extra]


def fake_liger(monkeypatch) -> dict:
    """Liger's functions replaced by recorders; the fused loss computes what the plain peer does."""
    seen: dict = {"patched": [], "loss": []}

    def patch(kind):
        return lambda **kw: seen["patched"].append((kind, kw))

    def fused(x, weight, target, ignore_index, reduction):
        seen["loss"].append({"x": x.shape, "weight": weight, "target": target.clone(), "reduction": reduction})
        return peer_peft.plain_loss(x, weight, target)

    monkeypatch.setattr(peer_peft, "liger_functions", lambda: ({"dense": patch("dense"), "moe": patch("moe")}, fused))
    monkeypatch.setattr(peer_peft, "stack_import_problem", lambda stack: None)
    return seen


@pytest.mark.parametrize("recipe", [DENSE, MOE])
def test_the_liger_stack_takes_hidden_states_and_masked_labels(recipe, short_rows, tmp_path, monkeypatch):
    plain = tmp_path / "plain.json"
    assert peer_peft.main(toy_argv(recipe, short_rows, plain)) == 0
    seen = fake_liger(monkeypatch)
    liger = tmp_path / "liger.json"
    assert peer_peft.main(toy_argv(recipe, short_rows, liger, "--peer-stack", "liger")) == 0
    a, b = json.loads(plain.read_text()), json.loads(liger.read_text())
    # the same rows, weights and normalization: the same loss per supervised token
    assert [s["loss"] for s in b["steps"]] == pytest.approx([s["loss"] for s in a["steps"]], rel=1e-5)
    assert b["stack"]["stack"] == "liger" and "Liger" in b["peer_stack"] and "Liger" not in a["peer_stack"]
    ((kind, kw),) = seen["patched"]
    moe = recipe == MOE
    assert kind == ("moe" if moe else "dense") and kw["swiglu"] is not moe  # the experts keep grouped GEMMs
    assert kw["fused_linear_cross_entropy"] is False and kw["rms_norm"] is True
    assert type(kw["model"]).__name__.endswith("ForCausalLM")
    hidden = TOY[recipe]["hidden_size"]
    calls = seen["loss"]
    assert len(calls) == 2 * 2  # two rows per step, two steps
    for call in calls:
        assert call["x"][-1] == hidden and call["reduction"] == "sum"
        assert call["weight"].shape == (TOY[recipe]["vocab_size"], hidden)
        masked = call["target"] == -100
        assert masked.any() and (~masked).any()  # prompts and padding out, answers in


def test_a_stack_that_does_not_import_is_recorded_as_not_installed(short_rows, tmp_path, capsys):
    for stack in ("liger", "unsloth"):
        if all(importlib.util.find_spec(m) for m in peer_peft.STACKS[stack].modules):
            continue  # installed here: nothing to show
        out = tmp_path / f"{stack}.json"
        assert peer_peft.main(toy_argv(DENSE, short_rows, out, "--peer-stack", stack)) == peer_peft.NOT_INSTALLED
        doc = json.loads(out.read_text())
        assert doc["result"] is None and doc["peer_stack_name"] == stack
        assert peer_peft.STACKS[stack].modules[0] in doc["not_installed"] and "error" not in doc
        err = capsys.readouterr().err
        assert "not installed" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        peer_peft.main(toy_argv(DENSE, short_rows, tmp_path / "x.json", "--peer-stack", "deepspeed"))
    assert exc.value.code == 2 and "--peer-stack deepspeed" in capsys.readouterr().err


def test_an_import_that_fails_is_not_installed_too(monkeypatch):
    def broken(name):
        raise RuntimeError("built for another torch\nmore")

    monkeypatch.setattr("importlib.import_module", broken)
    problem = peer_peft.stack_import_problem("liger")
    assert "liger_kernel" in problem and "RuntimeError" in problem and "more" not in problem
    assert peer_peft.stack_import_problem("plain") is None


def test_the_causal_conv1d_convolution_gets_each_tokens_conversation(short_rows, monkeypatch):
    from bridge_recipes.data.packed_rows import PackedRowsDataset

    cfg = peer_peft.workload_config(DENSE, short_rows, ROWS_OVERRIDES)
    spec = peer_peft.model_spec(cfg, TOY[DENSE])
    sample = PackedRowsDataset(short_rows, 2048, 1, vocab_size=spec.vocab_size)[0]
    kwargs, _, _ = peer_peft.micro_batch(sample, "cpu", seq_idx=True)
    cu = sample["cu_seqlens_q"].tolist()
    index = kwargs["seq_idx"][0]
    assert kwargs["seq_idx"].dtype == torch.int32 and index.numel() == cu[-1]
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        assert (index[a:b] == i).all()
    assert "seq_idx" not in peer_peft.micro_batch(sample, "cpu")[0]
    # the package's function as the model's convolution: found, and given the conversations
    model = peer_peft.build_model(spec, "cpu", "sdpa", False)
    assert peer_peft.conv_kernel(model) == "torch"
    got = []

    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, activation=None, **kw):
        got.append(seq_idx)
        out = torch.nn.functional.conv1d(x, weight[:, None], bias, padding=weight.shape[-1] - 1, groups=x.shape[1])
        return torch.nn.functional.silu(out[..., : x.shape[-1]])

    causal_conv1d_fn.__module__ = "causal_conv1d.causal_conv1d_interface"
    layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    if not hasattr(layers[0], "causal_conv1d_fn"):
        pytest.skip("this transformers calls a module-level convolution")
    for layer in layers:
        layer.causal_conv1d_fn = causal_conv1d_fn
    assert peer_peft.conv_kernel(model).startswith(peer_peft.CONV_KERNEL)
    with torch.no_grad():
        model(**kwargs)
    assert len(got) == len(layers) and all(torch.equal(g, kwargs["seq_idx"]) for g in got)


# --- the comparison ---------------------------------------------------------------------------


def test_the_comparison_tries_the_stacks_in_order_and_names_the_best(short_rows, tmp_path, monkeypatch):
    monkeypatch.setattr(lora_vs_peft, "gpu_problem", lambda: None)
    fake_launches(monkeypatch, ms=2000.0, peak_gb=40.0)
    runs = []
    speeds = {"liger": 900.0, "plain": 300.0}

    def peer(cmd, log):
        stack = cmd[cmd.index("--peer-stack") + 1]
        runs.append(stack)
        out = Path(cmd[cmd.index("--out") + 1])
        if stack == "unsloth":
            why = "--peer-stack unsloth: unsloth does not import"
            out.write_text(json.dumps({"result": None, "not_installed": why}))
            return peer_peft.NOT_INSTALLED
        result = {"tokens_per_s": speeds[stack], "peak_allocated_gb": 44.0, "window": [3, 6]}
        out.write_text(json.dumps({"result": result, "peer_stack": f"{stack} as run", "model": "qwen35_27b"}))
        return 0

    monkeypatch.setattr(lora_vs_peft, "streamed", peer)
    out, work = tmp_path / "c.json", tmp_path / "w"
    argv = ["--rows", str(short_rows), "--out", str(out), "--work", str(work), "--recipe", DENSE]
    argv += ["--steps", "6", "--window", "3", "6", *SHORT_ROWS]
    assert lora_vs_peft.main(argv) == 0
    assert runs == ["unsloth", "liger"]  # the first that ran ends the search
    (line,) = json.loads(out.read_text())
    assert line["best_peer"] == "liger" and line["peer_tokens_per_s"] == 900.0
    assert [p["stack"] for p in line["peers"]] == ["unsloth", "liger"]  # plain was never tried: absent
    assert line["peers"][0]["outcome"] == "not installed" and "unsloth" in line["peers"][0]["why"]
    assert line["tokens_per_s_ratio"] == round(line["ours_tokens_per_s"] / 900.0, 3)
    assert "peer_error" not in line and line["peer_stack"] == "liger as run"
    # every configuration: the fastest that ran is the best, whatever the order
    runs.clear()
    assert lora_vs_peft.main([*argv, "--all-peer-stacks", "--peer-stack", "plain", "--peer-stack", "liger"]) == 0
    assert runs == ["plain", "liger"] and json.loads(out.read_text())[0]["best_peer"] == "liger"
    # --assemble reads back what the work folder holds, in the same order
    assert lora_vs_peft.main([*argv, "--assemble"]) == 0
    again = json.loads(out.read_text())[0]
    assert [p["stack"] for p in again["peers"]] == ["unsloth", "liger"] and again["best_peer"] == "liger"


def test_no_peer_that_fits_is_an_answer_and_a_broken_one_a_failure(short_rows, tmp_path, monkeypatch):
    monkeypatch.setattr(lora_vs_peft, "gpu_problem", lambda: None)
    fake_launches(monkeypatch, ms=2000.0, peak_gb=40.0)
    ends = {}

    def peer(cmd, log):
        stack = cmd[cmd.index("--peer-stack") + 1]
        out = Path(cmd[cmd.index("--out") + 1])
        end = ends[stack]
        if end == "not installed":
            out.write_text(json.dumps({"result": None, "not_installed": f"{stack} does not import"}))
            return peer_peft.NOT_INSTALLED
        out.write_text(json.dumps({"result": None, "error": end}))
        return 1

    monkeypatch.setattr(lora_vs_peft, "streamed", peer)
    out = tmp_path / "c.json"
    argv = ["--rows", str(short_rows), "--out", str(out), "--work", str(tmp_path / "w"), "--recipe", L40S_35B]
    argv += ["--gpu-memory-gb", "auto", "--steps", "6", "--window", "3", "6", *SHORT_ROWS]
    ends.update(unsloth="not installed", liger="out of memory: CUDA out of memory.", plain="out of memory: CUDA")
    assert lora_vs_peft.main(argv) == 0
    (line,) = json.loads(out.read_text())
    assert line["peer_fits"] is False and line["best_peer"] is None and line["peer_tokens_per_s"] is None
    assert [p["outcome"] for p in line["peers"]] == ["not installed", "out of memory", "out of memory"]
    # a configuration that broke might have fit: the comparison fails, the line says what is known
    ends.update(liger="the liger stack could not prepare the model: TypeError: x")
    assert lora_vs_peft.main(argv) == 1
    (line,) = json.loads(out.read_text())
    assert line["peer_fits"] is False and line["peers"][1] == {
        "stack": "liger",
        "outcome": "failed",
        "why": ends["liger"],
    }
    ends.update(plain="peer_peft exited 1")
    assert lora_vs_peft.main(argv) == 1
    assert json.loads(out.read_text())[0]["peer_fits"] is None  # none ran out of memory: unknown


def test_a_cap_below_the_recipe_is_refused_before_anything_runs(short_rows, tmp_path, monkeypatch, capsys):
    launched = fake_launches(monkeypatch, ms=2000.0, peak_gb=40.0)
    monkeypatch.setattr(lora_vs_peft, "gpu_problem", lambda: None)
    monkeypatch.setattr(lora_vs_peft, "streamed", lambda cmd, log: pytest.fail("a peer ran"))
    out = tmp_path / "c.json"
    base = ["--rows", str(short_rows), "--work", str(tmp_path / "w"), "--recipe", H100_35B]
    for mode in (["--out", str(out)], ["--dry-run"]):
        with pytest.raises(SystemExit) as exc:
            lora_vs_peft.main([*base, *mode, "--gpu-memory-gb", "48"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "--gpu-memory-gb 48" in err and H100_35B in err
        assert L40S_35B in err  # the recipe of the model planned to fit 48 GB
    assert not launched and not out.exists()
    # the card's own memory passes the check
    opts = lora_vs_peft.build_parser().parse_intermixed_args([*base, "--gpu-memory-gb", "auto", *SHORT_ROWS])
    assert lora_vs_peft.cap_problem(H100_35B, opts) is None
    opts.gpu_memory_gb = "20"
    assert "raise the cap" in lora_vs_peft.cap_problem(L40S_35B, opts)
