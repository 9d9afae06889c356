"""The single-GPU LoRA comparison on a CPU.

The transformers + PEFT peer: a toy of the recipe's model trains on packed rows and writes its
figures; the adapters sit where the recipe's do, with its rank and alpha; a packed row's
conversations see only themselves; a run cut short keeps the figures of its logged steps. The
one command: its dry run passes for both one-GPU LoRA recipes at full size (ours' runner dry run
with --lora-from-random-init as the benchmark launches it, the planner, the peer's every layer,
expert and vocabulary row on the meta device); the benchmark passes the option and its result
says so; ours faked at the launch and the peer a toy, it writes the comparison list after each
recipe, errors included, and --assemble writes it again from the work folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import pytest

import bridge_recipes
from bridge_recipes.bench import benchmark
from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.data.synthetic_chat import build_lognormal_rows, conversations_jsonl
from bridge_recipes.features import random_lora
from bridge_recipes.hardware.gpus import class_memory_gb
from bridge_recipes.recipes.base import LORA_TARGETS
from lab import lora_vs_peft, peer_peft

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
MOE, DENSE = "qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config", "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config"
TOY = {MOE: peer_peft.CPU_TOY_SIZES["moe"], DENSE: peer_peft.CPU_TOY_SIZES["dense"]}
ROW_TOKENS = 2048
SHORT_ROWS = [f"model.seq_length={ROW_TOKENS}", f"dataset.seq_length={ROW_TOKENS}"]
ROWS_OVERRIDES = [*SHORT_ROWS, "train.global_batch_size=2"]


@pytest.fixture(autouse=True)
def allocator_setting_restored(monkeypatch):
    """The peer sets the recipe's PYTORCH_CUDA_ALLOC_CONF in its process (here, the test's) when unset."""
    monkeypatch.setenv(peer_peft.ALLOCATOR, "unset")
    monkeypatch.delenv(peer_peft.ALLOCATOR)  # restored to what it was after the test


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    """The real-format chats the GPU comparison trains on: 8,192-token rows packed with boundaries."""
    out = tmp_path_factory.mktemp("lognormal") / "boundaries"
    build_lognormal_rows(out, TOKENIZER, "boundaries")
    return out


@pytest.fixture(scope="module")
def short_rows(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("short_rows")
    (tmp / "c.jsonl").write_text(conversations_jsonl(40))
    build_sft_rows(tmp / "c.jsonl", TOKENIZER, tmp / "rows", row_tokens=ROW_TOKENS, progress=False)
    return tmp / "rows"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The toy peer's matrices are small: one thread, so a shared CPU does not thrash."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the peer ---------------------------------------------------------------------------------


def toy_workload(recipe: str, rows: Path, *overrides: str):
    cfg = peer_peft.workload_config(recipe, rows, [*ROWS_OVERRIDES, *overrides])
    return cfg, peer_peft.model_spec(cfg, TOY[recipe])


def test_a_toy_of_the_moe_recipe_trains_on_packed_rows_and_writes_its_figures(short_rows, tmp_path, capsys):
    out = tmp_path / "peer.json"
    argv = ["--recipe", MOE, "--rows", str(short_rows), "--steps", "3", "--window", "2", "3", "--out", str(out)]
    assert peer_peft.main([*argv, *peer_peft.size_args(TOY[MOE]), *ROWS_OVERRIDES]) == 0
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


def test_training_moves_the_adapters_and_leaves_the_base_weights(short_rows):
    import torch

    from bridge_recipes.data.packed_rows import PackedRowsDataset

    cfg, spec = toy_workload(MOE, short_rows)
    model = peer_peft.add_adapters(peer_peft.build_model(spec, "cpu", "sdpa", True), cfg.peft, spec.is_moe)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = PackedRowsDataset(short_rows, ROW_TOKENS, 4, vocab_size=spec.vocab_size)
    records = peer_peft.train(model, data, steps=2, global_batch=2, optimizer_cfg=cfg.optimizer, device="cpu")
    assert [r["tokens"] for r in records] == [2 * ROW_TOKENS] * 2
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert moved and moved <= trainable and all(".lora_" in n for n in trainable)
    assert any("experts" in n for n in moved)  # the routed experts' adapters train too


def test_the_adapters_follow_the_recipes_lora(short_rows):
    cfg, spec = toy_workload(DENSE, short_rows, "peft.dim=8", "peft.alpha=16")
    model = peer_peft.add_adapters(peer_peft.build_model(spec, "meta", "sdpa", False), cfg.peft, spec.is_moe)
    layer = model.base_model.model.model.layers[0].linear_attn.in_proj_z
    assert layer.lora_A["default"].weight.shape[0] == 8 and layer.scaling["default"] == 2.0
    assert "experts.gate_up_proj" not in peer_peft.adapted_names(model)  # a dense model has none
    cfg.peft.target_modules = [*cfg.peft.target_modules, "router"]
    with pytest.raises(peer_peft.PeerError, match="router"):
        peer_peft.lora_config(cfg.peft, moe=False)


def test_a_packed_rows_conversations_see_only_themselves(short_rows, monkeypatch):
    """Attention through the position ids the peer passes: each conversation of a packed row gives
    the logits it gives alone (every layer attention here: on a CPU transformers' Gated DeltaNet
    is its PyTorch reference, which takes no boundaries); the boundaries reach the Gated DeltaNet
    kernel as its cu_seqlens."""
    import torch

    from bridge_recipes.data.packed_rows import PackedRowsDataset

    cfg, spec = toy_workload(DENSE, short_rows, "peft.dim=8")
    data = PackedRowsDataset(short_rows, ROW_TOKENS, 1, vocab_size=spec.vocab_size)
    sample = data[0]
    cu = sample["cu_seqlens_q"].tolist()
    assert len(cu) > 3  # a few conversations (and the padding) in the row
    attention = peer_peft.build_model(
        dataclasses.replace(spec, full_attention_interval=1), "cpu", "sdpa", False
    ).float()
    kwargs, _, _ = peer_peft.micro_batch(sample, "cpu")
    with torch.no_grad():
        packed = attention(**kwargs).logits[0]
        for a, b in zip(cu[:2], cu[1:3]):
            alone = attention(input_ids=sample["tokens"][None, a:b]).logits[0]
            assert torch.allclose(packed[a:b], alone, atol=1e-4), (a, b)
    seen = []

    def spy(kernel):
        return lambda *args, **kw: seen.append(kw["cu_seqlens"]) or kernel(*args, **kw)

    gdn = peer_peft.build_model(spec, "cpu", "sdpa", False)
    for module in gdn.modules():
        if type(module).__name__.endswith("GatedDeltaNet"):
            if hasattr(module, "chunk_gated_delta_rule"):  # transformers 5.12: a kernel bound to each layer
                module.chunk_gated_delta_rule = spy(module.chunk_gated_delta_rule)
            else:  # later releases: one module-level kernel
                modeling = sys.modules[type(module).__module__]
                kernel = peer_peft.MODULE_KERNEL
                monkeypatch.setattr(modeling, kernel, spy(getattr(modeling, kernel)))
                break
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


def test_bad_input_exits_2_naming_it(short_rows, tmp_path, capsys):
    out = str(tmp_path / "p.json")
    base = ["--rows", str(short_rows), "--out", out, *ROWS_OVERRIDES]
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
        (["--recipe", DENSE, "--rows", str(short_rows), "--steps", "3"], "--out"),
        (["--recipe", DENSE, *base, "--steps", "3", "--window", "2", "5"], "--window"),
    ):
        with pytest.raises(SystemExit) as exc:
            peer_peft.main(argv)
        assert exc.value.code == 2 and named in capsys.readouterr().err
    assert not Path(out).exists()


def test_a_run_out_of_memory_writes_its_error_and_exits_1(short_rows, tmp_path, monkeypatch):
    import torch

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(peer_peft, "train", out_of_memory)
    out = tmp_path / "peer.json"
    argv = ["--recipe", DENSE, "--rows", str(short_rows), "--steps", "2", "--window", "1", "2", "--out", str(out)]
    assert peer_peft.main([*argv, *peer_peft.size_args(TOY[DENSE]), *ROWS_OVERRIDES]) == 1
    doc = json.loads(out.read_text())
    assert doc["result"] is None and "out of memory" in doc["error"] and doc["peer_stack"]


# --- the one command --------------------------------------------------------------------------


def in_process(monkeypatch, sizes: dict | None = None) -> list[list[str]]:
    """Run the runner's and the peer's commands in this process (the peer as a toy when ``sizes``);
    returns the argument lists they got."""
    from bridge_recipes.runner import cli

    seen = []

    def run(cmd, log_path):
        module, args = cmd[2], cmd[3:]
        seen.append(args)
        if module == "bridge_recipes.runner":
            return cli.main(args)
        assert module == "lab.peer_peft"
        recipe = args[args.index("--recipe") + 1]
        return peer_peft.main([*args, *peer_peft.size_args((sizes or {}).get(recipe, {}))])

    monkeypatch.setattr(lora_vs_peft, "streamed", run)
    return seen


def megatron_log(steps: int, global_batch: int, ms: float, peak_gb: float) -> str:
    """Megatron-Bridge's iteration and memory lines of a run of ``steps`` equal steps."""
    lines = []
    for i in range(1, steps + 1):
        lines.append(
            f" [2026-01-01 00:00:{i:02d}] iteration {i:8d}/{steps:8d} | consumed samples: {i * global_batch:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000000E-04 | global batch size: "
            f"{global_batch:5d} | lm loss: 1.200000E+01 | loss scale: 1.0 | grad norm: 1.000 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |"
        )
        lines.append(
            f"[Rank 0] (after {i} iterations) memory (GB) | mem-allocated-gigabytes: 80.0 | "
            f"mem-max-allocated-gigabytes: {peak_gb} | mem-max-reserved-gigabytes: {peak_gb + 2}"
        )
    return "\n".join(lines) + "\n"


def fake_launches(monkeypatch, ms: float, peak_gb: float) -> list[list[str]]:
    """Ours' training process replaced by a log of equal steps; returns the runner arguments launched."""
    from bridge_recipes.bench import runs

    launched = []

    def launch(name, recipe, args, log_path, nproc=1):
        launched.append(args)
        steps = int(args[args.index("--max-steps") + 1])
        gb = int(next(a for a in args if a.startswith("train.global_batch_size=")).split("=")[1])
        return argparse.Namespace(returncode=0, log=megatron_log(steps, gb, ms, peak_gb), losses={})

    monkeypatch.setattr(runs, "launch", launch)
    # the result names the GPU it ran on: here, none; an H200 stands in
    monkeypatch.setattr(benchmark, "running_gpu", lambda: "H200")
    return launched


def test_the_dry_run_passes_for_both_recipes_at_full_size(rows, tmp_path, monkeypatch, capsys):
    seen = in_process(monkeypatch)
    assert lora_vs_peft.main(["--rows", str(rows), "--dry-run", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    ours = [a for a in seen if "--dry-run" in a and "--steps" not in a]
    peers = [a for a in seen if "--steps" in a]
    assert [a[a.index("--recipe") + 1] for a in ours] == list(lora_vs_peft.RECIPES)
    for args in ours:  # the benchmark's launch arguments: rows, no checkpoints, random base weights
        assert random_lora.OPTION in args and "checkpoint.save=null" in args and "--dataset" in args
        assert f"train.global_batch_size={lora_vs_peft.GLOBAL_BATCH}" in args and f"dataset.path={rows}" in args
    assert out.count("checks: ok") == 2 and out.count(random_lora.NOTE) == 2
    assert "no pretrained weights" not in capsys.readouterr().err  # the random-init warning gives way
    # each peer configuration in turn; one whose packages this CPU lacks is said to be, not failed
    stacks = [a[a.index("--peer-stack") + 1] for a in peers]
    assert stacks == list(peer_peft.BY_EXPECTED_SPEED) * 2 and all("--dry-run" in a for a in peers)
    assert "64 layers" in out and "256 experts" in out and "experts.gate_up_proj" in out
    assert out.count("ours' dry run passes") == 2 and out.count("plain passes") == 2
    for recipe in lora_vs_peft.RECIPES:
        _, cfg, plan = lora_vs_peft.planned(
            recipe, lora_vs_peft.build_parser().parse_args(["--rows", str(rows)]), tmp_path / "r.yaml"
        )
        assert cfg.model.vocab_size == 248320 and plan.fits
        assert f"planner {plan.peak_allocated_gb:.1f} GB allocated, {plan.peak_gb:.1f} GB" in out


def test_the_benchmark_passes_the_option_and_its_result_says_so(rows, tmp_path, monkeypatch):
    from bridge_recipes.bench import benchmark
    from bridge_recipes.bench.result import read_result

    launched = fake_launches(monkeypatch, ms=4000.0, peak_gb=91.5)
    out = tmp_path / "ours.yaml"
    argv = ["--recipe", MOE, "--rows", str(rows), "--steps", "6", "--window", "2", "6", "--out", str(out)]
    assert benchmark.main([*argv, random_lora.OPTION, "train.global_batch_size=2"]) == 0
    assert random_lora.OPTION in launched[0]
    doc = read_result(out)
    assert random_lora.NOTE in doc["notes"]
    assert doc["result"]["tokens_per_s_per_gpu"] == pytest.approx(2 * 8192 / 4.0, rel=1e-3)
    assert doc["result"]["peak_allocated_gb"] == 91.5
    # without the option the LoRA run is launched as before: no note, no flag
    assert benchmark.main([*argv, "train.global_batch_size=2"]) == 0
    assert random_lora.OPTION not in launched[1] and random_lora.NOTE not in read_result(out)["notes"]
    # on a recipe without LoRA the option is refused before anything runs
    sft = ["--recipe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "--rows", str(rows), "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        benchmark.main([*sft, random_lora.OPTION])
    assert exc.value.code == 2 and len(launched) == 2


def test_the_one_command_writes_the_comparison_list(short_rows, tmp_path, monkeypatch):
    monkeypatch.setattr(lora_vs_peft, "gpu_problem", lambda: None)  # ours is faked, the peer runs on the CPU
    launched = fake_launches(monkeypatch, ms=2000.0, peak_gb=95.0)
    seen = in_process(monkeypatch, TOY)
    out = tmp_path / "single_gpu_lora_vs_peft.json"
    argv = ["--rows", str(short_rows), "--out", str(out), "--work", str(tmp_path / "work"), "--steps", "6"]
    assert lora_vs_peft.main([*argv, "--window", "3", "6", "--global-batch", "1", *SHORT_ROWS]) == 0
    lines = json.loads(out.read_text())
    assert [line["recipe"] for line in lines] == list(lora_vs_peft.RECIPES)
    for line, ours_args, peer_args in zip(lines, launched, seen):
        assert tuple(line)[: len(lora_vs_peft.FIELDS)] == lora_vs_peft.FIELDS
        # the same rows, rows per step and overrides for both; ours on random base weights
        for args in (ours_args, peer_args):
            assert f"dataset.path={short_rows}" in args or str(short_rows) in args
            assert "train.global_batch_size=1" in args and all(o in args for o in SHORT_ROWS)
        assert random_lora.OPTION in ours_args
        peer = json.loads((tmp_path / "work" / f"{line['recipe']}_peer.json").read_text())
        assert line["ours_tokens_per_s"] == pytest.approx(2048 / 2.0, rel=1e-3) and line["ours_peak_gb"] == 95.0
        assert line["peer_tokens_per_s"] == peer["result"]["tokens_per_s"] > 0
        assert line["peer_peak_gb"] is None and line["peer_stack"] == peer["peer_stack"]
        assert line["tokens_per_s_ratio"] == pytest.approx(
            line["ours_tokens_per_s"] / line["peer_tokens_per_s"], rel=1e-2
        )
        assert (line["steps"], line["row_tokens"], line["global_batch"], line["window"]) == (6, 2048, 1, [3, 6])
        assert 0 < line["planner_gb"] < line["planner_total_gb"] < 150.1
        assert random_lora.NOTE in line["ours_notes"] and "ours_error" not in line and "peer_error" not in line
    assert lines[0]["model"] == "qwen35_27b" and lines[1]["model"] == "qwen35_35b_a3b"


def test_a_failed_run_is_recorded_and_the_next_one_runs(short_rows, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lora_vs_peft, "gpu_problem", lambda: None)  # ours is faked, the peer runs on the CPU
    fake_launches(monkeypatch, ms=2000.0, peak_gb=95.0)
    monkeypatch.setattr(lora_vs_peft, "streamed", lambda cmd, log: 1)  # the peer dies before writing anything
    out = tmp_path / "c.json"
    argv = [
        "--rows",
        str(short_rows),
        "--out",
        str(out),
        "--work",
        str(tmp_path),
        "--steps",
        "6",
        "--window",
        "2",
        "6",
    ]
    argv += SHORT_ROWS
    assert lora_vs_peft.main(argv) == 1
    lines = json.loads(out.read_text())
    assert len(lines) == 2 and all("peer_peft exited 1" in line["peer_error"] for line in lines)
    assert all(line["peer_tokens_per_s"] is None and line["ours_tokens_per_s"] for line in lines)


def test_bad_input_and_no_gpu_exit_2(short_rows, tmp_path, capsys):
    cases = [
        (["--rows", str(short_rows)], "--out"),
        (["--rows", str(tmp_path / "none"), "--dry-run"], "--rows"),
        (["--rows", str(short_rows), "--dry-run", "--recipe", "qwen35_27b_sft_8gpu_h200_bf16_config"], "one-GPU LoRA"),
        (["--rows", str(short_rows), "--dry-run", "--global-batch", "0"], "--global-batch"),
    ]
    cases.append((["--rows", str(short_rows), "--out", str(tmp_path / "c.json"), *SHORT_ROWS], "no CUDA GPU"))
    for argv, named in cases:
        with pytest.raises(SystemExit) as exc:
            lora_vs_peft.main([*argv, "--work", str(tmp_path / "w")])
        assert exc.value.code == 2 and named in capsys.readouterr().err, argv
    assert not (tmp_path / "c.json").exists()


def test_the_queued_commands_pass_their_checks(rows, tmp_path):
    """Every line of the one-GPU queue that runs the comparison does so with arguments that pass every
    check made before a run starts, on the rows the queue builds (here the same rows, built by the
    fixture)."""
    import shlex

    queue = (ROOT / "lab/gpu/queues/h200_1gpu.txt").read_text().splitlines()
    steps = [s for s in queue if "lab.lora_vs_peft" in s and not s.startswith("#")]
    assert steps
    for step in steps:
        *build, run = (shlex.split(part) for part in step.replace("$OUT", str(tmp_path)).split("&&"))
        build = [b for b in build if b[1] != "lab/gpu/needs_memory.py"]  # a guard: the line needs an H200's memory
        words = run[run.index("lab.lora_vs_peft") + 1 :]
        if build:
            assert build[0][1] == "lab/gpu/make_lognormal_rows.py"
            assert words[words.index("--rows") + 1] == f"{build[0][2]}/boundaries"
        words[words.index("--rows") + 1] = str(rows)
        opts = lora_vs_peft.build_parser().parse_intermixed_args(words)
        opts.recipe = opts.recipe or list(lora_vs_peft.RECIPES)
        opts.peer_stack = opts.peer_stack or list(peer_peft.BY_EXPECTED_SPEED)
        assert lora_vs_peft.argument_problems(opts) == [] and Path(opts.out).suffix == ".json"
        for recipe in opts.recipe:
            lora_vs_peft.planned(recipe, opts, tmp_path / f"{recipe}.yaml")  # raises on a problem
            assert lora_vs_peft.cap_problem(recipe, opts) is None  # ours fits the cap it runs under


# --- a run cut short, and the comparison assembled from a work folder -----------------------------


def peer_log(steps_logged: int, steps: int = 10, gb: int = 2, row: int = 2048, per: str = "per") -> str:
    """The ``[peer]`` lines of a peer run that logged ``steps_logged`` of its ``steps`` steps (``per``: the
    header's word before "step")."""
    lines = [
        f"[peer] {DENSE}: qwen35_27b (64 layers, no experts, vocabulary 248320) on cuda; {gb} rows of {row} "
        f"tokens {per} step (boundaries rows), {steps} steps",
        "[peer] Gated DeltaNet chunk kernel here: fla.ops.gated_delta_rule.chunk; attention sdpa",
        "[peer] stack: transformers + PEFT (as logged)",
    ]
    lines += [
        f"[peer] step {i}/{steps}: {2.0 + i / 100:.2f} s, {gb * row / 2.0:.0f} tokens/s, loss {9 - i / 10:.4f}, "
        "peak 91.8 GB"
        for i in range(1, steps_logged + 1)
    ]
    return "\n".join(lines) + "\n"


def test_the_peers_figures_come_from_its_log_when_it_stopped_part_way():
    doc = peer_peft.result_from_log(peer_log(8), (3, 9), 0.5)
    r = doc["result"]
    assert r["window"] == [3, 8] and doc["cut_short"] == "the log ends after step 8 of 10"
    times = [2.0 + i / 100 for i in range(3, 9)]
    assert r["tokens_per_s"] == pytest.approx(len(times) * 2 * 2048 / sum(times), abs=0.1)
    assert r["useful_tokens_per_s"] == pytest.approx(r["tokens_per_s"] / 2, abs=0.1)
    assert r["peak_allocated_gb"] == pytest.approx(91.8) and doc["peer_stack"] == "transformers + PEFT (as logged)"
    assert "cut_short" not in peer_peft.result_from_log(peer_log(10), (3, 9), None)
    # the committed logs of earlier runs carry the header's older wording
    assert peer_peft.result_from_log(peer_log(8, per="a"), (3, 9), 0.5)["result"] == r
    with pytest.raises(ValueError, match="after step 4"):
        peer_peft.result_from_log(peer_log(4), (3, 9), None)
    with pytest.raises(ValueError, match="rows of"):
        peer_peft.result_from_log("[peer] step 1/10: 2.00 s, 1 tokens/s, loss 1.0\n", (3, 9), None)


def test_a_peer_that_dies_part_way_keeps_the_figures_of_its_logged_steps(short_rows, tmp_path, monkeypatch):
    monkeypatch.setattr(lora_vs_peft, "gpu_problem", lambda: None)
    fake_launches(monkeypatch, ms=2000.0, peak_gb=95.0)

    def dies_at_step_8(cmd, log):
        log.write_text(peer_log(8, row=ROW_TOKENS))
        return 1

    monkeypatch.setattr(lora_vs_peft, "streamed", dies_at_step_8)
    out = tmp_path / "c.json"
    argv = ["--rows", str(short_rows), "--out", str(out), "--work", str(tmp_path / "w"), "--recipe", DENSE]
    assert lora_vs_peft.main([*argv, "--steps", "10", "--window", "3", "9", *SHORT_ROWS]) == 1
    (line,) = json.loads(out.read_text())
    assert line["peer_tokens_per_s"] > 0 and line["peer_window"] == [3, 8]
    assert line["peer_cut_short"] == "the log ends after step 8 of 10" and "peer_peft exited 1" in line["peer_error"]
    # the same comparison assembled again from the work folder, nothing run
    monkeypatch.setattr(lora_vs_peft, "run_ours", None)
    monkeypatch.setattr(lora_vs_peft, "run_peer", None)
    again = tmp_path / "again.json"
    argv[3] = str(again)
    assert lora_vs_peft.main([*argv, "--assemble", "--steps", "10", "--window", "3", "9", *SHORT_ROWS]) == 0
    (assembled,) = json.loads(again.read_text())
    assert {k: v for k, v in assembled.items() if k != "peer_error"} == {
        k: v for k, v in line.items() if k != "peer_error"
    }


def test_a_variant_joining_its_rows_trains_the_peer_on_the_same_rows(short_rows):
    """The fast 35B-A3B recipe carries four rows per micro batch, which ours runs as one sequence of the
    four joined: by default both runs train one such micro batch per step (its base, one row per micro
    batch, two rows); the peer trains the same rows, of the same length, and at the same rows per step
    shares its base's run."""
    from bridge_recipes.config.datasets import row_tokens, rows_per_step

    def rows_and_tokens(cfg):
        return rows_per_step(cfg), row_tokens(cfg)

    fast = "qwen35_35b_a3b_peft_1gpu_h200_bf16_config"
    opts = lora_vs_peft.build_parser().parse_intermixed_args(["--rows", str(short_rows), *SHORT_ROWS])
    assert (lora_vs_peft.step_rows(MOE, opts), lora_vs_peft.step_rows(fast, opts)) == (2, 4)
    cfg = peer_peft.workload_config(fast, short_rows, lora_vs_peft.overrides(fast, opts))
    assert (cfg.train.global_batch_size, cfg.dataset.rows_per_sample, cfg.model.seq_length) == (1, 4, 4 * ROW_TOKENS)
    assert rows_and_tokens(cfg) == (4, ROW_TOKENS)
    assert lora_vs_peft.shared_peers([MOE, fast], opts) == {MOE: MOE, fast: fast}
    # at the same rows per step the peer's workload is the same
    same = lora_vs_peft.build_parser().parse_intermixed_args(
        ["--rows", str(short_rows), *SHORT_ROWS, "--global-batch", "4"]
    )
    assert lora_vs_peft.step_rows(MOE, same) == 4
    assert lora_vs_peft.shared_peers([MOE, fast], same) == {MOE: MOE, fast: MOE}
    base = peer_peft.workload_config(MOE, short_rows, lora_vs_peft.overrides(MOE, same))
    assert rows_and_tokens(base) == (4, ROW_TOKENS)
    # rows per micro batch set on the command line set the default too; eight rows are two sequences of four
    two_rows = ["train.micro_batch_size=1", "dataset.rows_per_sample=2", f"model.seq_length={2 * ROW_TOKENS}"]
    two = lora_vs_peft.build_parser().parse_intermixed_args(["--rows", str(short_rows), *SHORT_ROWS, *two_rows])
    assert lora_vs_peft.step_rows(fast, two) == 2
    eight = peer_peft.workload_config(fast, short_rows, [*SHORT_ROWS, "train.global_batch_size=8"])
    assert (eight.train.global_batch_size, rows_and_tokens(eight)) == (2, (8, ROW_TOKENS))


def test_a_variant_changing_only_ours_shares_its_bases_peer_run(short_rows, tmp_path, monkeypatch, capsys):
    fast = "qwen35_27b_peft_1gpu_h200_bf16_config"
    opts = lora_vs_peft.build_parser().parse_intermixed_args(["--rows", str(short_rows), *SHORT_ROWS])
    assert lora_vs_peft.shared_peers([DENSE, fast, MOE], opts) == {DENSE: DENSE, fast: DENSE, MOE: MOE}
    # a changed LoRA rank is another peer workload
    monkeypatch.setattr(
        peer_peft, "workload_key", lambda cfg: {"rank": cfg.peft.dim, "fast": cfg.model.cross_entropy_fusion_impl}
    )
    assert lora_vs_peft.shared_peers([DENSE, fast], opts)[fast] == fast
    monkeypatch.undo()
    # the one command runs the shared peer once and both lines carry its figures
    monkeypatch.setattr(lora_vs_peft, "gpu_problem", lambda: None)
    fake_launches(monkeypatch, ms=2000.0, peak_gb=95.0)
    seen = in_process(monkeypatch, {DENSE: TOY[DENSE], fast: TOY[DENSE]})
    out, work = tmp_path / "c.json", tmp_path / "work"
    argv = ["--rows", str(short_rows), "--out", str(out), "--work", str(work), "--steps", "6", "--window", "3", "6"]
    assert lora_vs_peft.main([*argv, "--recipe", DENSE, "--recipe", fast, *SHORT_ROWS]) == 0
    peers = [a for a in seen if "--steps" in a]
    assert [a[a.index("--recipe") + 1] for a in peers] == [DENSE] * len(peer_peft.BY_EXPECTED_SPEED)
    assert not (work / f"{fast}_peer.json").exists()
    base, variant = json.loads(out.read_text())
    assert variant["peer_recipe"] == DENSE and "peer_recipe" not in base
    assert variant["peer_tokens_per_s"] == base["peer_tokens_per_s"] > 0
    # --assemble reads the shared run from the work folder the same way
    again = tmp_path / "again.json"
    assemble = [*argv[:3], str(again), *argv[4:], "--assemble", "--recipe", DENSE, "--recipe", fast, *SHORT_ROWS]
    assert lora_vs_peft.main(assemble) == 0
    assert json.loads(again.read_text())[1]["peer_tokens_per_s"] == variant["peer_tokens_per_s"]


def test_a_peer_out_of_memory_under_a_cap_is_an_answer(short_rows, tmp_path, monkeypatch):
    """At a card's memory the peer that cannot fit is recorded as not fitting and the command succeeds;
    both runs were launched under the recipe card's cap."""
    monkeypatch.setattr(lora_vs_peft, "gpu_problem", lambda: None)
    launched = fake_launches(monkeypatch, ms=2000.0, peak_gb=45.0)
    peers = []

    def out_of_memory(cmd, log):
        peers.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.write_text(json.dumps({"result": None, "error": "out of memory: CUDA out of memory. Tried to allocate"}))
        return 1

    monkeypatch.setattr(lora_vs_peft, "streamed", out_of_memory)
    out = tmp_path / "c.json"
    recipe = "qwen35_27b_peft_1gpu_l40s_fp8base_config"
    argv = ["--rows", str(short_rows), "--out", str(out), "--work", str(tmp_path / "w"), "--recipe", recipe]
    assert (
        lora_vs_peft.main([*argv, "--gpu-memory-gb", "auto", "--steps", "10", "--window", "3", "9", *SHORT_ROWS]) == 0
    )
    (line,) = json.loads(out.read_text())
    card = class_memory_gb("l40s")
    assert line["peer_fits"] is False and line["memory_cap_gb"] == float(f"{card:g}") and line["ours_tokens_per_s"] > 0
    assert line["base_precision"] == "fp8" and "out of memory" in line["peer_error"]
    assert launched[0][launched[0].index("--gpu-memory-gb") + 1] == f"{card:g}"
    assert peers[0][peers[0].index("--gpu-memory-gb") + 1] == f"{card:g}"
