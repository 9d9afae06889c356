"""Layout checks: each failure is caught before launch and says what to change."""

import re

import pytest

from bridge_recipes.runner import checks


@pytest.fixture
def moe():
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_35b_a3b_sft_8gpu_h200_bf16_config

    return qwen35_35b_a3b_sft_8gpu_h200_bf16_config()


@pytest.fixture
def dense():
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_27b_sft_8gpu_h200_bf16_config

    return qwen35_27b_sft_8gpu_h200_bf16_config()


def messages(cfg, world):
    return [str(p) for p in checks.errors(checks.check(cfg, world))]


def test_published_layouts_pass(moe, dense):
    assert messages(moe, 8) == [] and messages(dense, 8) == []


def one_error(cfg, world, pattern):
    msgs = messages(cfg, world)
    assert any(re.search(pattern, m) for m in msgs), msgs


def test_world_size_not_divisible(dense):
    one_error(dense, 6, r"world size 6 is not divisible by TP x PP x CP = 1 x 4 x 1 = 4")


def test_layers_against_pipeline_splits(dense):
    dense.model.num_layers_in_first_pipeline_stage = 15  # 64-15-14 = 35 over 2 middle stages
    one_error(dense, 8, r"64 layers do not split over PP=4 stages with first=15 last=14")


def test_layers_against_pp_without_splits(dense):
    dense.model.num_layers_in_first_pipeline_stage = dense.model.num_layers_in_last_pipeline_stage = None
    dense.model.pipeline_model_parallel_size = 3
    one_error(dense, 6, r"64 layers do not split over PP=3")


def test_vpp_against_layers_per_stage(dense):
    dense.model.virtual_pipeline_model_parallel_size = 3
    one_error(dense, 8, r"layers per stage \[16, 17, 17, 14\] are not divisible by VPP=3")


def test_vpp_needs_pipeline(moe):
    moe.model.virtual_pipeline_model_parallel_size = 2
    one_error(moe, 8, "virtual pipeline stages need PP > 1")


def test_kv_heads_against_tp(moe):
    moe.model.tensor_model_parallel_size = 4
    moe.model.sequence_parallel = True
    one_error(moe, 8, r"KV heads \(num_query_groups\) = 2 is not divisible by TP=4")


def test_experts_against_ep(moe):
    moe.model.expert_model_parallel_size = 3
    one_error(moe, 24, "256 experts are not divisible by EP=3")


def test_unset_etp_is_refused(moe):
    moe.model.expert_tensor_parallel_size = None
    one_error(moe, 8, "expert_tensor_parallel_size is unset and would silently inherit TP")


def test_expert_group_against_data_parallel(moe):
    moe.model.expert_model_parallel_size = 16
    one_error(moe, 8, r"EP x ETP = 16 x 1 must divide TP x CP x DP = 1 x 1 x 8")


def test_sequence_against_cp_and_sp(moe):
    moe.model.context_parallel_size = 2
    moe.model.seq_length = moe.dataset.seq_length = 8190
    one_error(moe, 8, r"sequence length 8190 is not divisible by 2 x CP = 4")
    moe.model.context_parallel_size = 1
    moe.model.tensor_model_parallel_size, moe.model.sequence_parallel = 2, True
    moe.model.expert_model_parallel_size = 4
    moe.model.seq_length = moe.dataset.seq_length = 8191
    one_error(moe, 8, r"sequence length per CP rank 8191 is not divisible by TP=2")


def test_moe_with_tp_needs_sequence_parallel(moe):
    moe.model.tensor_model_parallel_size, moe.model.expert_model_parallel_size = 2, 4
    one_error(moe, 8, "needs sequence parallelism")


def test_model_and_data_sequence_lengths_must_agree(moe):
    moe.dataset.seq_length = 4096
    one_error(moe, 8, "model.seq_length=8192 differs from dataset.seq_length=4096")


def test_global_batch_against_micro_batch_and_dp(moe):
    moe.train.global_batch_size = 100
    one_error(moe, 8, r"global batch 100 is not divisible by micro batch x DP = 1 x 8")


def test_per_token_loss_cannot_average_in_collective(moe):
    moe.ddp.average_in_collective = True
    one_error(moe, 8, "set ddp.average_in_collective=false")


def test_fp8_parameters_are_refused_for_a_fine_tune_from_weights(dense, tmp_path):
    from bridge_recipes.config.overrides import apply_all

    apply_all(dense, {}, ["mixed_precision=bf16_with_fp8_current_scaling_mixed"])
    assert not checks.fp8_parameter_problems(dense)  # from random init: the master weights are its own
    dense.checkpoint.pretrained_checkpoint = str(tmp_path)
    (problem,) = checks.fp8_parameter_problems(dense)
    assert "set mixed_precision.fp8_param_gather=false" in problem and str(tmp_path) in problem
    assert f"error: {problem}" in messages(dense, 8)
    apply_all(dense, {}, ["mixed_precision.fp8_param_gather=false"])
    assert not checks.fp8_parameter_problems(dense)


def test_summary_names_the_precision(dense):
    from bridge_recipes.config.overrides import apply_all
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_27b_sft_8gpu_h200_fp8cs_fast_config

    assert "precision         bf16_mixed\n" in checks.summary(dense, 8)
    apply_all(dense, {}, ["mixed_precision=bf16_with_fp8_current_scaling_mixed"])
    ends = r"FP8 tensorwise\b.*first 1\b.*last 1\b"
    named = checks.summary(dense, 8)
    assert re.search(rf"^precision +bf16_with_fp8_current_scaling_mixed: {ends}.*FP8 parameters$", named, re.M), named
    fast = checks.summary(qwen35_27b_sft_8gpu_h200_fp8cs_fast_config(), 8)
    assert re.search(rf"^precision +{ends}.*BF16 parameters$", fast, re.M), fast


def test_the_fp8_fast_recipe_may_fine_tune_from_weights(tmp_path):
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_27b_sft_8gpu_h200_fp8cs_fast_config

    cfg = qwen35_27b_sft_8gpu_h200_fp8cs_fast_config()
    cfg.checkpoint.pretrained_checkpoint = str(tmp_path)
    assert not checks.fp8_parameter_problems(cfg)


def test_summary_describes_the_layout(dense):
    text = checks.summary(dense, 8)
    assert "TP1 PP4 DP2" in text and re.search(r"^layers per stage +\[16, 17, 17, 14\]$", text, re.M), text
    assert "full block 12" in text


def test_mock_tokenizer_vocabulary_must_fit_the_model():
    from perf_recipes.qwen.h200.qwen35 import qwen35_27b_sft_8gpu_h200_bf16_mock_config

    mock = qwen35_27b_sft_8gpu_h200_bf16_mock_config()
    assert mock.tokenizer.tokenizer_type == "NullTokenizer" and messages(mock, 8) == []
    mock.model.vocab_size = 32768  # a smaller head without the tokenizer's vocabulary
    one_error(
        mock, 8, "tokenizer.vocab_size=248320 is larger than model.vocab_size=32768; set tokenizer.vocab_size=32768"
    )
    mock.tokenizer.vocab_size = 32768
    assert messages(mock, 8) == []


def test_the_op_fuser_needs_the_environments_opt_in(moe, monkeypatch):
    """Megatron-Core 0.19.2 builds SwiGLU experts as one op-fuser chain only with the fused grouped MLP
    opted in by the environment, and stops at model build otherwise (the first H200 attempt did, after
    81 s): the check names the setting and the fix before launch."""
    from bridge_recipes.config.overrides import apply_all
    from bridge_recipes.hardware.installed import OP_FUSER_ENV

    monkeypatch.delenv(OP_FUSER_ENV, raising=False)
    apply_all(moe, {}, ["model.use_transformer_engine_op_fuser=true"])
    (problem,) = checks.op_fuser_problems(moe)
    assert f"add +env_vars.{OP_FUSER_ENV}=1" in problem and "model.use_transformer_engine_op_fuser=false" in problem
    assert f"error: {problem}" in messages(moe, 8)
    assert not checks.op_fuser_problems(moe, {OP_FUSER_ENV: "1"})  # the process's environment counts too
    # an exported value wins over env_vars: the advice says the export is what to change
    (exported,) = checks.op_fuser_problems(moe, {OP_FUSER_ENV: "0"})
    assert f"{OP_FUSER_ENV}=0 is exported" in exported and f"export {OP_FUSER_ENV}=1" in exported
    apply_all(moe, {}, [f"+env_vars.{OP_FUSER_ENV}=1"])
    assert not checks.op_fuser_problems(moe) and not checks.op_fuser_problems(moe, {})
    assert checks.op_fuser_problems(moe, {OP_FUSER_ENV: "0"}) == [exported]  # the process's value wins
    apply_all(moe, {}, ["model.tensor_model_parallel_size=2"])
    (problem,) = checks.op_fuser_problems(moe)
    assert "model.tensor_model_parallel_size=2" in problem and "use -tp 1" in problem
    apply_all(moe, {}, ["model.tensor_model_parallel_size=1", "model.moe_apply_probs_on_input=true"])
    (problem,) = checks.op_fuser_problems(moe)
    assert "set model.moe_apply_probs_on_input=false" in problem


def test_the_op_fuser_rules_are_megatron_cores():
    """The installed Megatron-Core's own test of the fused expert chain has the three conditions the check
    mirrors; the dense model has no experts to fuse."""
    import inspect

    from megatron.core.transformer.moe.experts import TEGroupedMLP

    from bridge_recipes.hardware.installed import OP_FUSER_ENV
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_27b_sft_8gpu_h200_bf16_config

    source = inspect.getsource(TEGroupedMLP._is_fused_impl_supported)
    assert f'os.environ.get("{OP_FUSER_ENV}", "0")) <= 0' in source
    assert "self.tp_group.size() > 1" in source and "self.config.moe_apply_probs_on_input" in source
    dense = qwen35_27b_sft_8gpu_h200_bf16_config()
    dense.model.use_transformer_engine_op_fuser = True
    assert not checks.op_fuser_problems(dense, {})


def test_an_op_fuser_run_without_the_opt_in_stops_before_launch(capsys, monkeypatch):
    from bridge_recipes.hardware.installed import OP_FUSER_ENV
    from bridge_recipes.runner.cli import main

    monkeypatch.delenv(OP_FUSER_ENV, raising=False)
    recipe = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
    assert (
        main(["--recipe", recipe, "--dry-run", "--world-size", "8", "model.use_transformer_engine_op_fuser=true"]) == 2
    )
    err = capsys.readouterr().err
    assert f"add +env_vars.{OP_FUSER_ENV}=1" in err and "Traceback" not in err
