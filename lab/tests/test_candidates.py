"""Candidate policies (lab.candidates): predictions pinned as written before any
run, the planner's full-scale verdicts in the committed table, the proxy overrides, and
python -m lab.benchmark --candidate's runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import benchmark as bench
from lab.candidates import CANDIDATES, find, full_scale_verdict

ROOT = Path(__file__).resolve().parents[2]


def test_candidates_load_from_their_history_and_name_a_published_recipe():
    """lab/results/candidates/candidates.json is the candidates' record; each names a published recipe,
    overrides that parse, and a positive prediction."""
    from bridge_recipes.config import overrides
    from bridge_recipes.recipes import registry
    from lab.candidates import HISTORY, _load

    assert _load(HISTORY) == CANDIDATES and len({c.name for c in CANDIDATES}) == len(CANDIDATES)
    for c in CANDIDATES:
        registry.find(c.recipe)
        assert c.predicted_ratio > 0
        for token in (*c.overrides, *c.published_overrides):
            overrides.parse(token)


def test_a_candidate_file_round_trips(tmp_path):
    from lab.candidates import _load

    path = tmp_path / "c.json"
    path.write_text(
        '[{"name": "x", "model": "qwen35_27b", "overrides": ["a.b=1"], "change": "c", '
        '"predicted_ratio": 1.1, "basis": "b", "proxy_gpus": 2}]'
    )
    (c,) = _load(path)
    assert c.overrides == ("a.b=1",) and c.proxy_gpus == 2 and c.published_overrides == ()
    assert c.recipe == "qwen35_27b_sft_8gpu_h200_bf16_config"


def test_planner_verdicts_decide_what_may_run_at_full_scale():
    verdicts = {c.name: full_scale_verdict(c) for c in CANDIDATES}
    assert verdicts["35b_block30"]["fits"] and verdicts["35b_block30"]["exact"]
    assert not verdicts["27b_block11"]["fits"] and not verdicts["27b_vpp2_block6"]["fits"]
    selective = verdicts["35b_selective"]  # modelled, and over the H200's memory at full scale
    assert selective["exact"] and selective["selective"] and not selective["fits"]


def test_block_recompute_keeps_its_fraction_on_the_proxy():
    c = find("35b_block30")
    assert c.proxy_overrides(4) == ["model.recompute_method=block", "model.recompute_num_layers=3"]
    assert c.proxy_overrides(8)[-1] == "model.recompute_num_layers=6"
    assert c.proxy_overrides(None) == list(c.overrides)


def _opts(*argv):
    return bench.build_parser().parse_intermixed_args(list(argv))


def test_candidate_runs_side_by_side_with_its_published_policy(tmp_path):
    opts = _opts("--candidate", "35b_block30", "--proxy-layers", "4", "--out", str(tmp_path / "c.yaml"))
    runs = bench.runs_of(opts)
    assert [(label, name) for label, name, _ in runs] == [
        ("35b_block30", "qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config"),
        ("published", "qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config"),
    ]
    problems, plans = bench.product.argument_problems(opts, runs)
    assert problems == []
    cand, published = (cfg.model for _, cfg in plans)
    assert (cand.recompute_method, cand.recompute_num_layers) == ("block", 3)
    assert (published.recompute_method, published.recompute_num_layers) == ("uniform", 1)
    assert cand.num_layers == published.num_layers == 4


def test_a_candidate_names_what_the_published_arm_keeps_as_it_ran(tmp_path):
    """Gradient-accumulation fusion now stays on without APEX (bridge_recipes.features.te_wgrad), so its candidate's
    published arm turns it off as every earlier proxy run had it; the candidate's arm sets it on."""
    opts = _opts("--candidate", "35b_grad_accum_fusion", "--proxy-layers", "16", "--out", str(tmp_path / "c.yaml"))
    runs = bench.runs_of(opts)
    assert [own for *_, own in runs] == [
        ["model.gradient_accumulation_fusion=true"],
        ["model.gradient_accumulation_fusion=false"],
    ]
    problems, plans = bench.product.argument_problems(opts, runs)
    assert problems == []
    cand, published = (cfg.model for _, cfg in plans)
    assert cand.gradient_accumulation_fusion and not published.gradient_accumulation_fusion
    assert cand.num_layers == published.num_layers == 16


def test_a_candidate_on_chat_rows_runs_the_recipe_itself_on_them(tmp_path):
    """--rows: both runs train the recipe (not its mock form) on the packed rows, so the loss-curve
    check sees chat rows; the candidate's overrides stay on its own run."""
    rows = ROOT / "lab/evidence/sft_rows_synthetic/rows"
    opts = _opts(
        "--candidate", "27b_fp8_current", "--proxy-layers", "4", "--rows", str(rows), "--steps", "30",
        "--window", "4", "29", "--out", str(tmp_path / "c.yaml"),
    )  # fmt: skip
    runs = bench.runs_of(opts)
    assert {name for _, name, _ in runs} == {"qwen35_27b_sft_8gpu_h200_bf16_config"}
    problems, plans = bench.product.argument_problems(opts, runs)
    assert problems == []
    (cand_request, cand), (ref_request, ref) = plans
    assert cand_request["dataset"] == ref_request["dataset"] == "sft-rows"
    assert type(cand.dataset).__name__ == type(ref.dataset).__name__ == "PackedSFTRowsConfig"
    assert Path(cand.dataset.path) == Path(ref.dataset.path) == rows
    assert cand.mixed_precision == "bf16_with_fp8_current_scaling_mixed" and ref.mixed_precision == "bf16_mixed"


def test_rows_that_are_not_a_rows_folder_exit_2_naming_the_option(tmp_path, capsys):
    (tmp_path / "rows").mkdir()
    argv = ["--candidate", "27b_fp8_current", "--proxy-layers", "4", "--rows", str(tmp_path / "rows")]
    with pytest.raises(SystemExit) as exc:
        bench.main([*argv, "--out", str(tmp_path / "o.yaml")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"--rows {tmp_path / 'rows'}: " in err and "scripts/build_sft_rows.py" in err
    assert not (tmp_path / "o.yaml").exists()


def test_against_set_changes_only_the_second_run(tmp_path):
    """--against-set: the second run is its recipe with these overrides after the command's, e.g. the
    two-rows recipe against itself at four rows per micro batch, in one command."""
    two = "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_mock_config"
    opts = _opts(
        "--proxy-layers", "16", "--recipe", two, "--against", two, "--against-set", "train.micro_batch_size=4",
        "model.moe_router_topk=8", "--out", str(tmp_path / "c.yaml"),
    )  # fmt: skip
    runs = bench.runs_of(opts)
    assert runs == [(two, two, []), (f"{two} with train.micro_batch_size=4", two, ["train.micro_batch_size=4"])]
    problems, plans = bench.product.argument_problems(opts, runs)
    assert problems == []
    (first_request, first), (request, second) = plans
    assert (first.train.micro_batch_size, second.train.micro_batch_size) == (2, 4)
    assert first.model.num_layers == second.model.num_layers == 16
    assert "train.micro_batch_size=4" in request["overrides"]
    assert "train.micro_batch_size=4" not in first_request["overrides"]
    assert request["overrides"].index("model.moe_router_topk=8") < request["overrides"].index(
        "train.micro_batch_size=4"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--candidate", "nope"], "--candidate 'nope' is not known"),
        (["--candidate", "35b_block30", "--recipe", "x"], "--candidate names both runs"),
        (["--candidate", "35b_block30", "--against-set", "train.micro_batch_size=4"], "--candidate names both runs"),
        (["--recipe", "qwen35_27b_sft_8gpu_h200_bf16_config", "--against-set", "a=1"], "--against-set a=1: changes"),
        ([], "--recipe NAME is required"),
    ],
)
def test_bad_candidate_arguments_exit_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main([*argv, "--out", str(tmp_path / "o.yaml")])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_expert_parallel_candidates_run_on_the_two_gpu_proxy(tmp_path):
    out = str(tmp_path / "c.yaml")
    opts = _opts("--candidate", "35b_shared_expert_overlap", "--proxy-layers", "4", "--proxy-gpus", "2", "--out", out)
    problems, plans = bench.product.argument_problems(opts, bench.runs_of(opts))
    assert problems == []
    (cand_request, cand), (_, published) = plans
    # EP2 kept, 32 experts per GPU as at full scale (256 / EP8), only the candidate's setting differs
    assert cand_request["gpus"] == 2 and cand.model.expert_model_parallel_size == 2
    assert cand.model.num_moe_experts == published.model.num_moe_experts == 64
    assert cand.model.moe_shared_expert_overlap and not published.model.moe_shared_expert_overlap
    one_gpu = _opts("--candidate", "35b_shared_expert_overlap", "--proxy-layers", "4", "--out", out)
    with pytest.raises(ValueError, match="pass --proxy-gpus 2"):
        bench.runs_of(one_gpu)
    bad = _opts("--recipe", "qwen35_27b_sft_8gpu_h200_bf16_config", "--proxy-gpus", "2", "--out", out)
    assert (
        "--proxy-gpus 2: at least 1, and more than 1 only with --proxy-layers"
        in bench.product.argument_problems(bad, bench.runs_of(bad))[0][0]
    )


def test_stage_split_candidate_balances_the_pipeline_and_runs_only_at_full_scale(tmp_path):
    """The 27B's published split puts the output layer and MTP on a stage of 14 layers: its slowest
    stage does 61.0 GFLOPs per token against 54.0 for the candidate's, 1.13x; the candidate fits by the
    planner and refuses a proxy."""
    import bridge_recipes
    from bridge_recipes.models.qwen35 import get_spec
    from lab.stages import balance_ratio, stage_training_flops

    c = find("27b_split_17_18_18_11")
    spec = get_spec(c.model)
    published = bridge_recipes.build(c.recipe)
    candidate = bridge_recipes.build(c.recipe, overrides=list(c.overrides))
    pub, cand = stage_training_flops(spec, published), stage_training_flops(spec, candidate)
    assert max(pub) == pub[-1] and round(max(pub) / 1e9, 1) == 61.0 and round(max(cand) / 1e9, 1) == 54.0
    assert round(balance_ratio(spec, published, candidate), 2) == 1.13
    assert c.predicted_ratio < balance_ratio(spec, published, candidate)
    assert full_scale_verdict(c)["fits"]
    with pytest.raises(ValueError, match="changes the pipeline split, which no proxy has"):
        bench.runs_of(_opts("--candidate", c.name, "--proxy-layers", "4", "--out", str(tmp_path / "c.yaml")))
    assert [
        label for label, _, _ in bench.runs_of(_opts("--candidate", c.name, "--out", str(tmp_path / "c.yaml")))
    ] == [
        c.name,
        "published",
    ]


def test_stage_flops_count_recompute_and_the_head():
    """Block recompute adds one forward of a stage's first N layers; the last stage carries the
    output layer and MTP; without recompute nothing is added."""
    import bridge_recipes
    from bridge_recipes.models.qwen35 import get_spec
    from lab import stages

    spec = get_spec("qwen35_27b")
    cfg = bridge_recipes.build("qwen35_27b_sft_8gpu_h200_bf16_config")
    none = bridge_recipes.build("qwen35_27b_sft_8gpu_h200_bf16_config", overrides=["model.recompute_granularity=null"])
    layers = stages.layer_forward_flops(spec, cfg)
    with_rc, without = stages.stage_training_flops(spec, cfg), stages.stage_training_flops(spec, none)
    assert with_rc[0] - without[0] == pytest.approx(sum(layers[:12]))  # first stage: 16 layers, 12 recomputed
    assert without[0] == pytest.approx(3 * sum(layers[:16]))
    assert without[-1] == pytest.approx(3 * (sum(layers[-14:]) + stages.head_forward_flops(spec, cfg)))


def test_fused_moe_kernels_are_on_and_two_rows_per_micro_batch_do_not_fit():
    """Grouped GEMM and the fused permutation are already on (not
    candidates), the fused router only in the fast recipe (the published keeps its layout's unfused
    one); two 8,192-token rows per micro batch plan over the H200 in each H200 SFT layout."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    for name in ("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config"):
        m = bridge_recipes.build(name).model
        assert m.moe_grouped_gemm and m.moe_permute_fusion
        assert m.moe_router_fusion == name.endswith("_fast_config")
    peaks = {
        name: round(plan_memory(bridge_recipes.build(name, overrides=["train.micro_batch_size=2"]), 8).peak_gb, 1)
        for name in (
            "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
            "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config",
            "qwen35_27b_sft_8gpu_h200_bf16_fast_config",
        )
    }
    assert list(peaks.values()) == [163.8, 212.1, 188.1]


def test_two_rows_per_micro_batch_keep_the_rows_per_step(tmp_path):
    """The two-rows candidate runs the proxy's 8 rows per step as 4 micro batches of 2, the published policy as 8
    of 1: the same tokens per step, so the ratio of tokens/s compares the two."""
    name = "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2"
    opts = _opts("--candidate", name, "--proxy-layers", "16", "--out", str(tmp_path / "c.yaml"))
    runs = bench.runs_of(opts)
    problems, plans = bench.product.argument_problems(opts, runs)
    assert problems == []
    (_, cand), (_, published) = plans
    assert (cand.train.micro_batch_size, published.train.micro_batch_size) == (2, 1)
    assert cand.train.global_batch_size == published.train.global_batch_size == 8
    assert (cand.model.recompute_method, cand.model.recompute_num_layers) == ("uniform", 1)
    assert cand.model.num_layers == published.model.num_layers == 16


def test_the_command_line_is_parsed_once(tmp_path, monkeypatch, capsys):
    """The lab's options and the product's are one parser's: the arguments are read once, and the
    product's checks still see the lab's options."""
    import argparse

    calls = []
    parse = argparse.ArgumentParser.parse_intermixed_args

    def counted(self, *args, **kwargs):
        calls.append(args)
        return parse(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_intermixed_args", counted)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--candidate", "35b_block30", "--recipe", "x", "--out", str(tmp_path / "o.yaml")])
    assert exc.value.code == 2 and "--candidate names both runs" in capsys.readouterr().err
    assert len(calls) == 1
