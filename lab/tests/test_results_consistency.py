"""Each committed result file agrees with the log it came from, and backs what cites it.

Nothing here pins a figure: every check recomputes a result from its log (or a ratio from its two
results and their logs) with the code that wrote it, so a re-measurement that commits its log and
result passes unchanged, and an edited figure fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge_recipes.bench.convergence import compare
from bridge_recipes.bench.harness import comparison, different_training, proxy_config
from bridge_recipes.bench.result import read_result
from bridge_recipes.config import overrides
from bridge_recipes.hf.parity import cases_in_log, gate_failures
from bridge_recipes.logs.megatron_log import parse_megatron_log, step_records_from_log, validation_losses
from bridge_recipes.logs.run_log import log_losses, split_runs
from bridge_recipes.logs.stats import summarize
from bridge_recipes.recipes import registry
from lab import benchmark as bench
from lab import resolve
from lab.candidates import find, parse_stem
from lab.evidence import RESUME_SAVE_INTERVAL, check_resume, check_training
from lab.hf_evidence import lora_failures

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "lab" / "results"
EVIDENCE = ROOT / "lab" / "evidence"
# Where a benchmark result's log lives: results/candidates/X.yaml -> evidence/candidates/X.log,
# results/X.yaml -> evidence/proxy/X.log (both under lab/)
LOG_FOLDERS = {
    RESULTS / "candidates": EVIDENCE / "candidates",
    RESULTS: EVIDENCE / "proxy",
    EVIDENCE / "lora_vs_peft": EVIDENCE / "lora_vs_peft",
}
BENCHMARK_RESULTS = sorted(p for folder in LOG_FOLDERS for p in folder.glob("*.yaml"))
# Ratio files of pairs whose two result files are not STEM.yaml and STEM_against.yaml
PAIRED_ELSEWHERE = {
    "h200_proxy_qwen35_35b_a3b_ratio.json": ("h200_policy", "h100_reference"),
    "h200_proxy_qwen35_35b_a3b_repeat_ratio.json": ("h200_policy_repeat", "h100_reference_repeat"),
    "h200_proxy_qwen35_27b_ratio.json": ("h200_policy", "slime_reference"),
}


def _log_of(result: Path) -> Path:
    return LOG_FOLDERS[result.parent] / f"{result.stem}.log"


def _is_benchmark_ratio(path: Path) -> bool:
    doc = json.loads(path.read_text())
    return isinstance(doc, dict) and {"candidate", "reference", "tokens_per_s_ratio", "loss_curves"} <= set(doc)


RATIOS = sorted(p for folder in LOG_FOLDERS for p in folder.glob("*_ratio.json") if _is_benchmark_ratio(p))


def _dataset_path(doc: dict) -> str | None:
    """The rows a benchmark run read: the last ``dataset.path=`` of its command."""
    paths = [t.split("=", 1)[1] for t in doc["command"].split() if t.startswith("dataset.path=")]
    return paths[-1] if paths else None


def _arms(ratio: Path) -> tuple[Path, Path]:
    """The two result files of a ratio file: the first recipe's, then the reference's."""
    if ratio.name in PAIRED_ELSEWHERE:
        model = ratio.name.removeprefix("h200_proxy_").split("_ratio")[0].removesuffix("_repeat")
        return tuple(ratio.parent / f"h200_proxy_{model}_{arm}.yaml" for arm in PAIRED_ELSEWHERE[ratio.name])
    stem = ratio.name.removesuffix("_ratio.json")
    return ratio.parent / f"{stem}.yaml", ratio.parent / f"{stem}_against.yaml"


@pytest.mark.parametrize("result", BENCHMARK_RESULTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_benchmark_result_is_what_its_log_gives(result):
    doc = read_result(result)
    r = doc["result"]
    log = _log_of(result).read_text()
    assert f"--recipe {doc['recipe']} " in log and "exit status 0" in log
    stats = summarize(
        # the log counts sequences, of the model's sequence length (rows joined into one are one)
        step_records_from_log(log, r["flops_per_token"]["seq_length"]),
        tuple(r["window"]),
        1,
        r["flops_per_token"]["model"],
        doc["gpu"]["type"],
    )
    assert stats.window_tokens == r["window_tokens"]
    assert stats.tokens_per_s_per_gpu == pytest.approx(r["tokens_per_s_per_gpu"], abs=0.01)
    assert stats.step_time_cv_percent == pytest.approx(r["step_time_cv_percent"], abs=0.01)
    assert stats.mfu == pytest.approx(r["mfu"], abs=1e-4)
    assert stats.peak_allocated_gb == pytest.approx(r["peak_allocated_gb"], abs=1e-3)


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_ratio_file_is_what_its_two_results_and_logs_give(ratio):
    committed = json.loads(ratio.read_text())
    first, second = (read_result(p) for p in _arms(ratio))
    assert (first["recipe"], second["recipe"]) == (committed["candidate"], committed["reference"])
    assert first["result"]["window"] == second["result"]["window"]
    if committed["loss_curves"]["compared"]:
        losses = tuple(log_losses(_log_of(p).read_text()) for p in _arms(ratio))
    elif _dataset_path(first) != _dataset_path(second):  # the same recipe on two row sets
        losses = "the runs differ in dataset.path"
    else:
        losses = different_training(proxy_config(first["recipe"]), proxy_config(second["recipe"]))
    committed.pop("reference_overrides", None)
    committed.pop("prediction", None)  # written before the run, beside what it gave
    proxy = "--scale-down" in first["command"].split()  # a proxy run is the recipe scaled down
    assert committed == comparison(first, second, proxy=proxy, losses=losses)


@pytest.mark.parametrize("ratio", sorted((RESULTS / "candidates").glob("*_ratio.json")), ids=lambda p: p.stem)
def test_candidate_runs_carry_the_candidates_overrides(ratio):
    """The candidate's run carries its proxy overrides, its published policy's run none of them."""
    name, layers, rows = parse_stem(ratio.name.removesuffix("_ratio.json"))
    c = find(name)
    cand, ref = (read_result(p) for p in _arms(ratio))
    cand_cmd, ref_cmd = (d["command"].split() for d in (cand, ref))
    assert all(o in cand_cmd for o in c.proxy_overrides(layers))
    assert not any(o in ref_cmd for o in c.proxy_overrides(layers))
    assert cand["recipe"] == ref["recipe"] == (c.recipe if rows else c.mock_recipe)
    assert ("sft-rows" in cand_cmd) == rows == ("sft-rows" in ref_cmd)


# --- what backs a recipe's status ------------------------------------------------------------------

# What a recipe built from a candidate sets beyond the candidate's overrides (its pipeline split and recompute).
RECIPE_EXTRAS = {
    "qwen35_27b_sft_8gpu_h200_bf16_fast_config": (
        "model.num_layers_in_first_pipeline_stage=16",
        "model.num_layers_in_last_pipeline_stage=12",
        "model.recompute_num_layers=11",
    ),
    "qwen35_27b_sft_8gpu_h200_fp8cs_fast_config": (
        "model.num_layers_in_first_pipeline_stage=16",
        "model.num_layers_in_last_pipeline_stage=10",
        "model.recompute_num_layers=14",
    ),
}
CANDIDATE_RECIPES = [
    n
    for n, e in registry.discover().items()
    if e.meta.status == "functional" and e.meta.evidence.startswith("evidence/candidates/")
]


@pytest.mark.parametrize("name", CANDIDATE_RECIPES)
def test_a_recipe_from_a_candidate_is_that_candidate_and_its_run_passed(name):
    """The recipe builds its published recipe with the candidate's overrides; the candidate's run (the
    recipe's evidence) trained, and its side-by-side loss check with the published policy passed."""
    evidence = resolve(registry.find(name).meta.evidence)
    assert check_training(log_losses(evidence.read_text())).passed
    ratio = json.loads((RESULTS / "candidates" / f"{evidence.stem}_ratio.json").read_text())
    assert ratio["loss_curves"]["passed"]
    c = find(parse_stem(evidence.stem)[0])
    published = registry.load(c.recipe)()
    for token in (*c.overrides, *RECIPE_EXTRAS.get(name, ())):
        overrides.apply(published, overrides.parse(token))
    recipe = registry.load(name)()
    for part in ("model", "optimizer", "ddp", "train", "mixed_precision"):
        assert repr(getattr(recipe, part)) == repr(getattr(published, part)), part


# --- Hugging Face evidence ---------------------------------------------------------------------------

HF = EVIDENCE / "hf"
# The driver logs whose "[hf-parity] case" lines make lab/results/hf_parity.json, in order.
HF_PARITY_LOGS = ("hf_evidence.log", "hf_evidence_finetune.log", "hf_evidence_real_width.log")


def test_hf_parity_results_are_the_cases_of_their_logs():
    cases = json.loads((RESULTS / "hf_parity.json").read_text())
    assert cases == [c for log in HF_PARITY_LOGS for c in cases_in_log((HF / log).read_text())]
    summary = json.loads((HF / "hf_evidence_summary.json").read_text())
    assert summary["gate_failures"] == gate_failures(cases_in_log((HF / "hf_evidence.log").read_text()))


def test_lora_summary_is_what_its_logs_say():
    """The LoRA arm's summary is the driver's last record; its losses and resume verdict follow from the
    three runs of its run log, and it passed every check."""
    lora = json.loads((HF / "hf_lora_summary.json").read_text())["lora"]
    records = [ln for ln in (HF / "hf_evidence_lora.log").read_text().splitlines() if "] lora: {" in ln]
    assert json.loads(records[-1].split("] lora: ", 1)[1]) == lora
    runs = split_runs((HF / "hf_lora.log").read_text())
    curves = {name: {it.step: it.lm_loss for it in parse_megatron_log(text)} for name, text in runs.items()}
    assert curves["lora"] == pytest.approx({int(k): v for k, v in lora["losses"].items()}, abs=1e-6)
    check = check_resume(
        curves["lora"], curves["lora_killed"], curves["lora_resumed"], save_interval=RESUME_SAVE_INTERVAL
    )
    assert (check.passed, check.reasons) == (lora["resume"]["passed"], lora["resume"]["reasons"])
    assert lora_failures(lora) == []


# --- SFT on real-format rows ----------------------------------------------------------------------------

SFT = EVIDENCE / "sft_real_format"


def test_sft_real_format_results_are_their_logs():
    result = json.loads((SFT / "sft_real_format.json").read_text())
    for name, run in result.items():
        log = (SFT / f"sft_real_format_{name}.log").read_text()
        losses = {it.step: it.lm_loss for it in parse_megatron_log(log)}
        assert {int(k): v for k, v in run["losses"].items()} == losses, name
        assert check_training(losses).passed == run["training"]["passed"], name


# --- the benchmark script replayed on committed runs --------------------------------------------------


def _replay(monkeypatch, arms: dict[str, Path]):
    """benchmark.py's GPU runs replaced by committed ones: run name -> its result file."""

    def committed_run(name, opts, out, request, cfg, label=None):
        path = arms["_against" if out.name.endswith("_against.yaml") else ""] if "" in arms else arms[name]
        return read_result(path), cfg, log_losses(_log_of(path).read_text())

    monkeypatch.setattr(bench.product, "one", committed_run)


def test_benchmark_script_writes_the_committed_ratio_file(tmp_path, monkeypatch):
    ratio = RESULTS / "h200_proxy_qwen35_27b_ratio.json"
    first, second = _arms(ratio)
    names = {read_result(p)["recipe"]: p for p in (first, second)}
    _replay(monkeypatch, names)
    tuned, reference = names
    argv = ["--proxy-layers", "4", "--recipe", tuned, "--against", reference, "--steps", "16"]
    assert bench.main([*argv, "--window", "4", "15", "--out", str(tmp_path / "27b.yaml")]) == 0
    assert json.loads((tmp_path / "27b_ratio.json").read_text()) == json.loads(ratio.read_text())


def test_against_set_names_the_reference_overrides_in_the_ratio_file(tmp_path, monkeypatch):
    ratio = RESULTS / "h200_proxy_qwen35_35b_a3b_fast_mt16k_block30_vs_mbs4_16_layers_ratio.json"
    first, second = _arms(ratio)
    _replay(monkeypatch, {"": first, "_against": second})
    reference = read_result(second)["recipe"]
    argv = ["--proxy-layers", "16", "--recipe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_mock_config"]
    argv += ["--against", reference, "--against-set", "train.micro_batch_size=4", "--steps", "16"]
    assert bench.main([*argv, "--window", "4", "15", "--out", str(tmp_path / "p.yaml")]) == 0
    written = json.loads((tmp_path / "p_ratio.json").read_text())
    assert written.pop("reference_overrides") == ["train.micro_batch_size=4"]
    assert written == json.loads(ratio.read_text())


def test_which_proxy_pairs_train_the_same_model():
    """The 27B tuned and reference layouts shrink to one model on the same rows; the 35B-A3B EP8
    policy and slime's EP4 layout keep 32 and 64 experts per GPU and read different row lengths."""
    dense = [
        proxy_config(n)
        for n in ("qwen35_27b_sft_8gpu_h200_bf16_config", "qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config")
    ]
    assert different_training(*dense) is None
    moe = [
        proxy_config(n)
        for n in ("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "qwen35_35b_a3b_sft_8gpu_h100_bf16_config")
    ]
    assert "routed experts 32 vs 64" in different_training(*moe)


def test_rows_joined_into_one_sequence_train_as_the_rows_apart():
    """Two runs on the same rows per step compare their loss curves whether or not the rows are joined
    into longer sequences; other rows per step or another row length are named."""
    from types import SimpleNamespace as NS

    def run(seq, gb, k=1):
        cfg = proxy_config("qwen35_27b_sft_8gpu_h200_bf16_config")
        cfg.model.seq_length, cfg.train.global_batch_size = seq, gb
        cfg.dataset = NS(rows_per_sample=k, path="/rows")
        return cfg

    assert different_training(run(8192, 4), run(16384, 2, k=2)) is None
    assert different_training(run(8192, 4), run(16384, 4, k=2)) == "the runs differ in rows per step"
    assert "row length (8192 vs 16384 tokens)" in different_training(run(8192, 4), run(16384, 4))


# --- packed rows' gradient against its FP32 reference ---------------------------------------------


def test_packed_gradient_parity_is_what_its_log_gives():
    from lab import parity

    committed = json.loads((RESULTS / "packed_gradient_parity.json").read_text())
    records = [json.loads(line) for line in (ROOT / committed["log"]).read_text().splitlines()]
    assert committed["cases"] == json.loads(json.dumps(parity.summarize(records)))
    assert committed["rule"]["grad_norm_ratio"] == list(parity.NORM_RATIO)
    defaults = [c for c in committed["cases"] if c["default_path"]]
    assert defaults and all(c["holds"] for c in defaults)  # the default path is the one proven


# --- VL fine-tuning from image conversations ---------------------------------------------------------

VL = EVIDENCE / "vl"


def test_vl_finetune_summary_is_what_its_logs_give():
    """The VL evidence's training curve and validation losses are its run log's, its held-out losses its
    driver log's, and its gates are recomputed from them."""
    from bridge_recipes.logs.megatron_log import validation_losses
    from lab.vl_evidence import failures

    summary = json.loads((VL / "vl_finetune_summary.json").read_text())
    run_log = (VL / "vl_finetune_run.log").read_text()
    train = summary["training"]
    losses = _by_step(train["losses"])
    assert losses == {it.step: it.lm_loss for it in parse_megatron_log(run_log)}
    assert _by_step(train["validation_losses"]) == validation_losses(run_log)
    assert check_training(losses).passed == train["check"]["passed"]
    held = [ln for ln in (VL / "vl_finetune.log").read_text().splitlines() if "] held out: {" in ln]
    assert json.loads(held[-1].split("] held out: ", 1)[1]) == {k: v["loss"] for k, v in summary["held_out"].items()}
    assert summary["failures"] == failures(summary)
    assert summary["passed"] is (not summary["failures"])


# --- one-GPU LoRA at full size against transformers + PEFT -------------------------------------------

LORA_VS_PEFT = EVIDENCE / "lora_vs_peft"


@pytest.mark.parametrize("line", json.loads((RESULTS / "single_gpu_lora_vs_peft.json").read_text()), ids=str)
def test_lora_vs_peft_lines_are_their_runs(line):
    """Each line's figures are ours' benchmark result (itself checked against its log above) and the
    peer's result or log, as ``lora_vs_peft --assemble`` reads them from the evidence folder."""
    from lab.lora_vs_peft import ours_document, peer_document

    ours = ours_document(LORA_VS_PEFT / f"{line['recipe']}.yaml")
    share = ours["workload"]["rows"]["useful_token_share"]
    peer_run = line.get("peer_recipe", line["recipe"])  # a variant shares its base's peer run
    peer = peer_document(LORA_VS_PEFT / f"{peer_run}_peer.json", tuple(line["window"]), share)
    assert line["ours_tokens_per_s"] == ours["result"]["tokens_per_s_per_gpu"]
    assert line["ours_peak_gb"] == ours["result"]["peak_allocated_gb"]
    assert line["peer_tokens_per_s"] == peer["result"]["tokens_per_s"]
    assert line["peer_peak_gb"] == peer["result"]["peak_allocated_gb"]
    assert line.get("peer_cut_short") == peer.get("cut_short")
    assert line["tokens_per_s_ratio"] == round(line["ours_tokens_per_s"] / line["peer_tokens_per_s"], 3)
    assert line["useful_token_share"] == share


# --- LoRA at an 80 or 48 GB card's memory, and the FP8 base's numerics --------------------------------

MEMORY_CLASSES = EVIDENCE / "lora_memory_classes"


@pytest.mark.parametrize("line", json.loads((RESULTS / "lora_memory_classes.json").read_text()), ids=str)
def test_memory_class_lines_are_their_runs(line):
    """Each line's figures are its runs' (ours' benchmark result, the peer's result or its out-of-memory
    end) under the card's cap, as ``lora_vs_peft --assemble --gpu-memory-gb auto`` reads them."""
    from bridge_recipes.hardware.gpus import class_memory_gb
    from lab.lora_vs_peft import ours_document, peer_document, peer_out, peer_outcome
    from lab.peer_peft import DEFAULT_STACK

    ours = ours_document(MEMORY_CLASSES / f"{line['recipe']}.yaml")
    share = ours["workload"]["rows"]["useful_token_share"]
    # each configuration tried ended as its run's file says; the line's figures are the best one's
    for tried in line.get("peers", []):
        doc = peer_document(peer_out(MEMORY_CLASSES, line["recipe"], tried["stack"]), tuple(line["window"]), share)
        assert tried["outcome"] == peer_outcome(doc)
    stack = line.get("best_peer") or (line["peers"][-1]["stack"] if line.get("peers") else DEFAULT_STACK)
    peer = peer_document(peer_out(MEMORY_CLASSES, line["recipe"], stack), tuple(line["window"]), share)
    assert line["gpu"] == registry.find(line["recipe"]).meta.gpu
    assert f"GPU memory capped (run_recipe.py --gpu-memory-gb) at {line['memory_cap_gb']:g} GB" in ours["notes"]
    # the cap it ran under is the card's memory to within half a GB, and the peak fits the card
    assert abs(line["memory_cap_gb"] - class_memory_gb(line["gpu"])) <= 0.5
    assert line["ours_tokens_per_s"] == ours["result"]["tokens_per_s_per_gpu"]
    assert line["ours_peak_gb"] == ours["result"]["peak_allocated_gb"] <= class_memory_gb(line["gpu"])
    assert line["peer_fits"] is (peer.get("result") is not None)
    if line["peer_fits"]:
        assert line["tokens_per_s_ratio"] == round(line["ours_tokens_per_s"] / line["peer_tokens_per_s"], 3)
    elif "peers" in line:
        assert line["peer_tokens_per_s"] is None and "out of memory" in [p["outcome"] for p in line["peers"]]
    else:
        assert line["peer_tokens_per_s"] is None and "out of memory" in line["peer_error"]


def test_the_fp8_base_numerics_are_their_logs():
    """The parity cases are the lines the GPU test printed, each verdict its criterion applied; the
    convergence is the pair's comparison."""
    doc = json.loads((RESULTS / "lora_fp8_base_parity.json").read_text())
    lines = (ROOT / doc["log"]).read_text().splitlines()
    printed = {c["model"]: c for c in (json.loads(ln) for ln in lines if ln.startswith('{"model"'))}
    assert [c["model"] for c in doc["cases"]] == list(printed)
    for case in doc["cases"]:
        run = printed[case["model"]]
        assert {k: run[k] for k in case if k in run} == {k: v for k, v in case.items() if k in run}
        assert case["grad_err_over_noise_floor"] == round(run["adapter_grad_err"] / run["noise_floor"], 2)
        assert case["holds"] is (run["loss_rel_err"] <= 0.01 and run["adapter_grad_err"] <= 0.10)
    for conv, path in ((doc["convergence"], doc["pair"]), (doc["convergence_fp8_gemms"], None)):
        pair = json.loads((ROOT / (path or conv["pair"])).read_text())["loss_curves"]
        assert (conv["correlation"], conv["final_loss_diff"], conv["passed"]) == (
            pair["correlation"],
            pair["final_loss_difference"],
            pair["passed"],
        )


# --- SFT through packed rows against one conversation per row -----------------------------------------

PACKED_SFT = sorted((EVIDENCE / "packing").glob("packed_sft_convergence_*.json"))
PACKINGS = ("boundaries", "one_per_row")


def _by_step(mapping: dict) -> dict[int, float]:
    return {int(k): v for k, v in mapping.items()}


def check_packed_sft_convergence(result: Path) -> None:
    """A family's file holds what its two logs give (losses, grad norms, validation losses) and the
    comparison bench.convergence recomputes from them, which passes."""
    doc = json.loads(result.read_text())
    curves = {}
    arms = {packing: doc[packing] for packing in PACKINGS}
    if "micro_batch" in doc:  # the packed rows again, several per micro batch
        arms["micro_batch"] = doc["micro_batch"]
    for arm, run in arms.items():
        log = (result.parent / run["log"]).read_text()
        iterations = parse_megatron_log(log)
        curves[arm] = {it.step: it.lm_loss for it in iterations if it.lm_loss is not None}
        assert _by_step(run["losses"]) == curves[arm], arm
        assert _by_step(run["grad_norms"]) == {it.step: it.grad_norm for it in iterations}, arm
        assert _by_step(run["validation_losses"]) == validation_losses(log) != {}, arm
    pairs = [("one_per_row", "boundaries", doc["comparison"])]
    if "micro_batch" in doc:
        pairs.append(("boundaries", "micro_batch", doc["micro_batch"]["comparison"]))
    for reference, candidate, committed in pairs:
        recomputed = compare(curves[reference], curves[candidate])
        assert json.loads(json.dumps(recomputed.as_dict())) == committed, candidate
    # the claim: packed rows train like one conversation per row (a joined micro batch is recorded as it came)
    assert doc["comparison"]["passed"], doc["comparison"]["reasons"]


@pytest.mark.parametrize("result", PACKED_SFT, ids=lambda p: p.stem)
def test_packed_sft_convergence_is_what_its_logs_give(result):
    check_packed_sft_convergence(result)


def test_the_packed_sft_check_finds_an_edited_figure(tmp_path):
    def log(scale: float) -> str:
        lines = [
            f"[2026-01-01 00:00:00] iteration {s}/ 10 | elapsed time per iteration (ms): 100.0 | "
            f"global batch size: 4 | lm loss: {12.0 * 0.8**s * scale:.6E} | grad norm: {3.0 / s:.3f} |"
            for s in range(1, 11)
        ]
        lines += [f" validation loss at iteration {s} | lm loss value: {2.0 * scale / s:.6E} |" for s in (5, 10)]
        return "\n".join(lines) + "\n"

    def arm(name: str, scale: float) -> dict:
        (tmp_path / f"{name}.log").write_text(text := log(scale))
        iterations = parse_megatron_log(text)
        return {
            "log": f"{name}.log",
            "losses": {it.step: it.lm_loss for it in iterations},
            "grad_norms": {it.step: it.grad_norm for it in iterations},
            "validation_losses": validation_losses(text),
        }

    doc = {packing: arm(packing, scale) for packing, scale in zip(PACKINGS, (1.0, 1.01))}
    curves = {p: {int(k): v for k, v in doc[p]["losses"].items()} for p in PACKINGS}
    doc["comparison"] = compare(curves["one_per_row"], curves["boundaries"]).as_dict()
    result = tmp_path / "packed_sft_convergence_toy.json"
    result.write_text(json.dumps(doc))
    check_packed_sft_convergence(result)
    joined = arm("boundaries_mb2", 1.005)
    joined["comparison"] = compare(curves["boundaries"], {int(k): v for k, v in joined["losses"].items()}).as_dict()
    doc["micro_batch"] = joined
    result.write_text(json.dumps(doc))
    check_packed_sft_convergence(result)
    for edit in (("boundaries", "validation_losses"), ("micro_batch", "losses")):
        edited = json.loads(json.dumps(doc))
        edited[edit[0]][edit[1]]["10"] = 0.1
        result.write_text(json.dumps(edited))
        with pytest.raises(AssertionError):
            check_packed_sft_convergence(result)


# --- a conversation's loss in every row layout against the conversation alone -----------------------

ROW_INVARIANCE = EVIDENCE / "packing" / "packed_row_invariance.json"


def check_row_invariance(result: Path) -> None:
    """Each family's layouts are the log's lines for them, and each holds: within the file's
    tolerance of the conversation alone."""
    doc = json.loads(result.read_text())
    lines = [json.loads(line) for line in result.with_suffix(".log").read_text().splitlines() if line.strip()]
    families = [k for k in doc if k != "layouts"]
    assert families and {(x["family"], x["layout"]) for x in lines} == {
        (f, lay) for f in families for lay in doc["layouts"]
    }
    for line in lines:
        family = doc[line["family"]]
        committed = dict(family[line.pop("layout")])
        line.pop("family")
        holds = committed.pop("holds")
        assert committed == line
        assert holds and line["max_rel_loss_diff"] <= family["tolerance"], line


@pytest.mark.skipif(not ROW_INVARIANCE.is_file(), reason="no row-invariance result committed")
def test_row_invariance_is_what_its_log_gives():
    check_row_invariance(ROW_INVARIANCE)


def test_the_row_invariance_check_finds_an_edited_figure(tmp_path):
    for name in ("packed_row_invariance.json", "packed_row_invariance.log"):
        (tmp_path / name).write_text((EVIDENCE / "packing" / name).read_text())
    result = tmp_path / "packed_row_invariance.json"
    check_row_invariance(result)
    doc = json.loads(result.read_text())
    doc["qwen35_27b"]["row_8192"]["loss"] += 1.0
    result.write_text(json.dumps(doc))
    with pytest.raises(AssertionError):
        check_row_invariance(result)


def test_row_building_throughput_is_its_log():
    """The build figures are the lines bench_row_building.py printed: each build's conversations, tokens
    and seconds, the raw encode, and the summary's rates derived from them."""
    import re

    doc = json.loads((RESULTS / "data_build_throughput.json").read_text())
    log = (ROOT / doc["log"]).read_text()
    builds = re.findall(
        r"^build (with (\d+) worker\(s\)|of \d+x the input): (\d+) conversations, (\d+) tokens in ([\d.]+) s",
        log,
        re.M,
    )
    per_worker = {int(w): (int(c), int(t), float(s)) for label, w, c, t, s in builds if w}
    assert sorted(per_worker) == sorted(b["workers"] for b in doc["builds"])
    for b in doc["builds"]:
        conversations, tokens, seconds = per_worker[b["workers"]]
        assert (b["conversations"], b["stream_tokens"]) == (conversations, tokens)
        assert b["seconds"] == pytest.approx(seconds, abs=5e-4)
        assert b["tokens_per_s"] == pytest.approx(tokens / seconds, rel=1e-3)
    best = max(doc["builds"], key=lambda b: b["tokens_per_s"])
    assert (doc["workers"], doc["tokens"], doc["tokens_per_s"]) == (
        best["workers"],
        best["stream_tokens"],
        best["tokens_per_s"],
    )
    (raw,) = re.findall(r"^raw encode: (\d+) tokens in ([\d.]+) s", log, re.M)
    assert doc["raw_encode_tokens_per_s"] == pytest.approx(int(raw[0]) / float(raw[1]), rel=1e-3)
    assert doc["share_of_raw_encode"] == pytest.approx(doc["tokens_per_s"] / doc["raw_encode_tokens_per_s"], abs=1e-3)
    one = per_worker[1][2]
    assert doc["workers_speedup"] == {str(w): pytest.approx(one / s, abs=2e-3) for w, (_, _, s) in per_worker.items()}
    larger = [(int(c), float(s)) for label, w, c, t, s in builds if not w]
    assert [r["conversations"] for r in doc["peak_rss_mb_of_larger_inputs"]] == [c for c, _ in larger]
    summary = log.strip().splitlines()[-1]
    assert f"{doc['turn_scaling_ratio']:.2f}x (" in summary and f"{doc['tokens_per_s']:,.0f} tokens/s" in summary


@pytest.mark.parametrize("entry", json.loads((RESULTS / "install_times.json").read_text()), ids=lambda e: e["install"])
def test_install_times_are_their_logs(entry):
    import re

    log = (ROOT / entry["log"]).read_text()
    minutes, seconds = re.search(r"^\[install\] done in (\d+) min (\d+) s", log, re.M).groups()
    assert entry["seconds"] == int(minutes) * 60 + int(seconds)
    size = re.search(r"\.venv is (\S+)$", log, re.M)
    assert entry["venv"] == (size.group(1) if size else None)
    compiled = "compiling transformer_engine_torch" in log
    assert entry["compiles"] is compiled and ("--light" in entry["command"]) is ("step 1/3" in log)
    if said := re.search(r"the compile took (\d+ min \d+ s)", entry["conditions"]):
        assert re.search(rf"^\[install\] compiled \S+ in {said.group(1)}$", log, re.M)


@pytest.mark.parametrize("name", ["command_times.json", "command_times_deferred_bodies.json"])
def test_command_times_are_their_log(name):
    from lab import command_times

    doc = json.loads((RESULTS / name).read_text())
    runs = command_times.runs_in_log((ROOT / doc["log"]).read_text())
    summary = command_times.summary(runs)
    assert {k: doc.get(k) for k in summary} == summary and summary["commands"]
