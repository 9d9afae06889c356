"""Benchmark measuring side: FLOPs per token, window statistics, Megatron log parser, result file."""

import datetime as dt
import importlib.metadata
import platform
from dataclasses import replace
from types import SimpleNamespace

import pytest

from bridge_recipes.bench import result as R
from bridge_recipes.hardware.gpus import GPUS, peak_bf16_flops
from bridge_recipes.logs import megatron_log as L
from bridge_recipes.logs import stats as S
from bridge_recipes.models import flops as F
from bridge_recipes.models.params import count_parameters
from bridge_recipes.models.qwen35 import Qwen35Spec, get_spec

# 4 layers: GDN, GDN, GDN, attention (every 4th); small enough to count by hand.
TINY = Qwen35Spec(
    name="tiny",
    num_layers=4,
    hidden_size=8,
    num_attention_heads=2,
    num_query_groups=1,
    head_dim=4,
    linear_num_key_heads=2,
    linear_key_head_dim=3,
    linear_num_value_heads=4,
    linear_value_head_dim=5,
    linear_conv_kernel_dim=4,
    full_attention_interval=4,
    ffn_hidden_size=16,
    vocab_size=32,
    mtp_num_layers=1,
    checkpoints={},
)
TINY_MOE = replace(
    TINY,
    name="tiny_moe",
    ffn_hidden_size=None,
    num_experts=4,
    moe_router_topk=2,
    moe_ffn_hidden_size=3,
    moe_shared_expert_ffn_hidden_size=5,
)


# --- FLOPs per token --------------------------------------------------------------------------


def _training(f, components):
    """Training FLOPs per token of some of the breakdown's components."""
    return F.TRAINING_TO_FORWARD * sum(f.forward[name] for name in components)


def test_tiny_dense_counter_equals_hand_calculation():
    s = 10
    f = F.model_flops_per_token(TINY, s, chunk_size=6)
    # attention layer (1 of 4): Q+gate 8x(2x2x4)=128, K,V 2x8x(1x4)=64, out (2x4)x8=64 -> 2 x 256
    attn_proj = 2 * (8 * 2 * 2 * 4 + 2 * 8 * 1 * 4 + 2 * 4 * 8)
    # causal core: 4 x heads x head_dim x (s+1)/2 = 4 x 2 x 4 x 11 / 2
    attn_core = 4 * 2 * 4 * 11 // 2
    # GDN (3 of 4): key dim 2x3=6, value dim 4x5=20; in_proj 8x(2x6+2x20)=416, beta/alpha 8x(2x4)=64, out 20x8=160
    gdn_proj = 2 * (416 + 64 + 160)
    gdn_conv = 2 * (2 * 6 + 20) * 4
    # recurrence per value head at C=6, dk=3, dv=5: kkt 2x6x3, solve 6^2/3, w 2x6x3, u 2x6x5,
    # V'=U-WS 2x3x5, S+=K^T V' 2x3x5, QS 2x3x5, QK^T 2x6x3, AV' 2x6x5
    per_head = 36 + 12 + 36 + 60 + 30 + 30 + 30 + 36 + 60
    assert per_head == 330
    mlp = 2 * 3 * 8 * 16
    lm_head = 2 * 8 * 32
    want = {
        "attention_projections": 1 * attn_proj,
        "gdn_projections": 3 * gdn_proj,
        "gdn_conv": 3 * gdn_conv,
        "mlp": 4 * mlp,
        "moe_router": 0,
        "moe_routed_experts": 0,
        "moe_shared_expert": 0,
        "lm_head": lm_head,
        "attention_core": 1 * attn_core,
        "gdn_recurrence": 3 * 4 * per_head,
        "mtp_projection": 2 * (2 * 8) * 8,
        "mtp_attention_projections": attn_proj,
        "mtp_attention_core": attn_core,
        "mtp_mlp": mlp,
        "mtp_lm_head": lm_head,
    }
    assert want["attention_core"] == 176 and want["gdn_recurrence"] == 3960 and want["gdn_projections"] == 3840
    assert f.forward == pytest.approx(want, rel=1e-12)
    assert list(f.forward) == list(F.COMPONENTS)
    assert f.training == pytest.approx({k: 3 * v for k, v in want.items()}, rel=1e-12)
    assert f.training_total == pytest.approx(3 * sum(want.values()), rel=1e-12)
    assert _training(f, F.MTP_COMPONENTS) == 3 * (256 + attn_proj + attn_core + mlp + lm_head)


def test_tiny_moe_mlp_terms_by_hand():
    f = F.model_flops_per_token(TINY_MOE, 10)
    assert f.forward["mlp"] == 0
    assert f.forward["moe_router"] == 4 * (2 * 8 * 4)  # 4 layers x hidden x experts
    assert f.forward["moe_routed_experts"] == 4 * (2 * 2 * 3 * 8 * 3)  # top-2 x SwiGLU(8 -> 3)
    assert f.forward["moe_shared_expert"] == 4 * 2 * (3 * 8 * 5 + 8)  # SwiGLU(8 -> 5) + gate 8 x 1
    assert f.forward["mtp_mlp"] == 2 * 8 * 4 + 2 * 2 * 3 * 8 * 3 + 2 * (3 * 8 * 5 + 8)


def test_recurrence_at_fla_chunk_size():
    # per value head: 6 C dk + 4 C dv + 6 dk dv + C^2/3 with C = 64
    per_head = 6 * 64 * 3 + 4 * 64 * 5 + 6 * 3 * 5 + 64 * 64 / 3
    assert F.gdn_recurrence_flops(TINY) == pytest.approx(4 * per_head, rel=1e-12)
    q35 = get_spec("qwen35_35b_a3b")  # 32 value heads, dk = dv = 128
    assert F.gdn_recurrence_flops(q35) == pytest.approx(
        32 * (6 * 64 * 128 * 2 - 2 * 64 * 128 + 6 * 128**2 + 64**2 / 3)
    )


@pytest.mark.parametrize(
    "spec",
    [TINY, TINY_MOE, *map(get_spec, ["qwen35_27b", "qwen35_35b_a3b", "qwen35_397b_a17b"])],
    ids=lambda s: s.name,
)
@pytest.mark.parametrize("seq", [1, 4096, 8192])
def test_weight_terms_are_exactly_six_n(spec, seq):
    f = F.model_flops_per_token(spec, seq, mtp_num_layers=0)
    six_n = 6 * count_parameters(spec).matmul_active
    assert _training(f, F.WEIGHT_COMPONENTS) == six_n == F.six_n_flops_per_token(spec)
    # without MTP, the total is 6N plus the attention core and the recurrence only
    assert _training(f, F.MTP_COMPONENTS) == 0
    assert f.training_total == pytest.approx(six_n + 3 * (f.forward["attention_core"] + f.forward["gdn_recurrence"]))


def test_six_n_reproduces_openrecipes_n():
    assert F.six_n_flops_per_token("qwen35_35b_a3b") == 6 * 2_946_252_800
    assert F.six_n_flops_per_token("qwen35_27b") == 6 * 25_623_920_640


def test_causal_attention_core_is_half_the_full_matrix_plus_the_diagonal():
    spec = get_spec("qwen35_27b")
    width = spec.num_attention_heads * spec.head_dim
    for seq in (1, 7, 8192):
        full = F.attention_core_flops(spec, seq, causal=False)
        causal = F.attention_core_flops(spec, seq)
        assert full == 4 * width * seq
        assert 2 * causal == full + 4 * width  # the diagonal: each token attends to itself
    assert F.attention_core_flops(spec, 1) == F.attention_core_flops(spec, 1, causal=False)
    ratio = F.attention_core_flops(spec, 8192) / F.attention_core_flops(spec, 8192, causal=False)
    assert ratio == pytest.approx(0.5, abs=1e-4)


def test_attention_grows_with_sequence_length_and_the_rest_does_not():
    seqs = [1, 64, 1024, 4096, 8192, 32768]
    fs = [F.model_flops_per_token("qwen35_35b_a3b", s) for s in seqs]
    core = [f.forward["attention_core"] + f.forward["mtp_attention_core"] for f in fs]
    totals = [f.training_total for f in fs]
    assert all(a < b for a, b in zip(core, core[1:]))
    assert all(a < b for a, b in zip(totals, totals[1:]))
    for name in (*F.WEIGHT_COMPONENTS, "gdn_recurrence"):
        assert len({f.forward[name] for f in fs}) == 1, name


def test_mtp_layers_and_errors():
    with_mtp = F.model_flops_per_token(TINY, 16)
    without = F.model_flops_per_token(TINY, 16, mtp_num_layers=0)
    assert with_mtp.mtp_num_layers == 1 and without.mtp_num_layers == 0
    assert with_mtp.training_total - without.training_total == pytest.approx(_training(with_mtp, F.MTP_COMPONENTS))
    with pytest.raises(ValueError):
        F.model_flops_per_token(TINY, 0)
    with pytest.raises(ValueError):
        F.model_flops_per_token(TINY, 16, mtp_num_layers=-1)


# --- window statistics ------------------------------------------------------------------------


def _steps(times, tokens=8 * 4096, first=1, **kw):
    return [S.StepRecord(step=first + i, time_s=t, tokens=tokens, **kw) for i, t in enumerate(times)]


def test_constant_step_time():
    records = _steps([170.0] + [2.0] * 19)  # a slow first step outside the window changes nothing
    st = S.summarize(
        records, (5, 19), world_size=8, flops_per_token=1e9, peak_flops=989.4e12, six_n_flops_per_token=5e8
    )
    assert st.window == (5, 19) and st.steps_recorded == 20
    assert st.window_tokens == 15 * 32768
    assert st.window_time_s == pytest.approx(30.0)
    assert st.tokens_per_s_per_gpu == pytest.approx(32768 / 2.0 / 8)  # 2,048
    assert st.step_time_mean_s == pytest.approx(2.0)
    assert st.step_time_cv_percent == 0.0
    assert st.tflops_per_s_per_gpu == pytest.approx(2048 * 1e9 / 1e12)
    assert st.mfu == pytest.approx(2048 * 1e9 / 989.4e12)
    assert st.mfu_6n == pytest.approx(st.mfu / 2)
    assert st.peak_allocated_gb is None and st.peak_reserved_gb is None


def test_population_cv_and_default_window():
    st = S.summarize(_steps([1.0, 3.0, 1.0, 3.0]), window=(1, 4))
    assert st.step_time_mean_s == 2.0
    assert st.step_time_std_s == 1.0  # population std of 1, 3, 1, 3
    assert st.step_time_cv_percent == pytest.approx(50.0)
    assert st.mfu is None and st.tflops_per_s_per_gpu is None
    assert S.summarize(_steps([1.0] * 20)).window == S.DEFAULT_WINDOW == (5, 19)


def test_openrecipes_35b_figures_reproduce():
    """openrecipes-35b-h200 #1: 8 GPUs, 128 rows of 8,192 tokens per step, window 5..19 -> window_tokens
    15,728,640; at 4,663.11 tokens/s/GPU, 6N MFU with the H200's 989.4 TFLOP/s is 0.0833."""
    step_tokens = 128 * 8192
    step_time = step_tokens / (8 * 4663.11)
    st = S.summarize(
        _steps([step_time] * 20, tokens=step_tokens),
        world_size=8,
        peak_flops="H200",
        six_n_flops_per_token=F.six_n_flops_per_token("qwen35_35b_a3b"),
    )
    assert st.window_tokens == 15_728_640
    assert st.tokens_per_s_per_gpu == pytest.approx(4663.11)
    assert round(st.mfu_6n, 4) == 0.0833


def test_peak_memory_is_the_max_over_ranks_and_steps():
    records = _steps([1.0] * 3, peak_allocated_bytes=(10e9, 12e9), peak_reserved_bytes=(13e9, 11e9))
    records.append(S.StepRecord(4, 1.0, 100, peak_allocated_bytes=[20_000_000_000, 5], peak_reserved_bytes=21e9))
    st = S.summarize(records, window=(2, 3))
    assert st.peak_allocated_gb == 20.0 and st.peak_reserved_gb == 21.0


@pytest.mark.parametrize(
    "window, message",
    [
        ((5, 19), r"missing steps 11-19; have steps 1..10"),
        ((0, 3), "1-based"),
        ((6, 5), "first <= last"),
    ],
)
def test_window_outside_the_records_is_an_error(window, message):
    with pytest.raises(ValueError, match=message):
        S.summarize(_steps([1.0] * 10), window)


def test_bad_records_are_errors():
    with pytest.raises(ValueError, match="missing steps 3, 5"):
        S.summarize([r for r in _steps([1.0] * 6) if r.step not in (3, 5)], (1, 6))
    with pytest.raises(ValueError, match="twice"):
        S.summarize(_steps([1.0] * 3) + _steps([1.0], first=2), (1, 3))
    with pytest.raises(ValueError, match="no step records"):
        S.summarize([], (1, 1))
    with pytest.raises(ValueError, match="world_size"):
        S.summarize(_steps([1.0] * 3), (1, 3), world_size=0)
    with pytest.raises(ValueError, match="positive"):
        S.StepRecord(1, 0.0, 10)


def test_gpu_peak_table():
    assert peak_bf16_flops("NVIDIA H200") == peak_bf16_flops("H100") == 989.4e12
    assert peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_bf16_flops("NVIDIA B200") == 2250e12
    assert peak_bf16_flops("NVIDIA GB200") == peak_bf16_flops("GB300") == 2500e12
    assert peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_bf16_flops("NVIDIA L40S") == 362.05e12
    for name in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA RTX 6000 Ada Generation", "Tesla V100"):
        with pytest.raises(KeyError):
            peak_bf16_flops(name)


def test_one_gpu_table_for_statistics_result_files_and_the_planner():
    """The datasheet memory goes into result files; the planner fits plans in the device's own
    figure (the test host's H200 reports 139.80 GiB to torch; 0.01 GiB below the printed figure), from the same row."""
    from bridge_recipes.plan import memory as M

    h200 = GPUS["H200"]
    assert R.gpu_block("NVIDIA H200", 8)["memory_gb"] == h200.memory_gb == 141
    assert h200.memory_bytes == pytest.approx(139.79 * 2**30)
    assert M.gpu_memory("h200") == h200.usable_memory_gb
    assert {k: M.gpu_memory(k) for k in M.GPU_MEMORY_GB} == {
        k: GPUS[k.upper()].usable_memory_gb for k in ("h200", "h100", "a100", "l40s", "b200", "gb300")
    }
    assert S.summarize(_steps([1.0] * 3), (1, 3), 1, 1e12, "NVIDIA H200").peak_flops == h200.peak_bf16_flops


# --- Megatron log --------------------------------------------------------------------------------

LINE = (
    " [2026-11-29 09:37:51] iteration        2/      20 | consumed samples:           16 | elapsed time per "
    "iteration (ms): 9164.8 | throughput per GPU (TFLOP/s/GPU): 29.2 | learning rate: 3.000000E-04 | global "
    "batch size:     8 | lm loss: 1.282916E+01 | load_balancing_loss: 0.000000E+00 | global_load_balancing_loss: "
    "1.005392E+00 | mtp_1 loss: 1.286125E+01 | loss scale: 1.0 | grad norm: 9.275 | number of skipped "
    "iterations:   0 | number of nan iterations:   0 |"
)


def test_parse_one_iteration_line():
    (it,) = L.parse_megatron_log("noise\n" + LINE + "\nStep Time : 5.60s GPU utilization: 47.9MODEL_TFLOP/s/GPU\n")
    assert (it.step, it.train_iters, it.global_batch_size) == (2, 20, 8)
    assert it.time_s == pytest.approx(9.1648)
    assert it.lm_loss == 12.82916 and it.grad_norm == 9.275
    assert it.timestamp == "2026-11-29 09:37:51"
    assert it.values["mtp_1 loss"] == 12.86125
    assert it.values["global_load_balancing_loss"] == 1.005392
    assert it.values["learning rate"] == 3e-4 and it.values["consumed samples"] == 16
    assert it.values["number of nan iterations"] == 0


def _timer_block(times: dict[str, tuple[float, float]], prefix: str = "[   80.0s] ") -> str:
    """Megatron's Timers.log text for one step, in megatron.core.timers' own format (min, max)."""
    lines = [f"{prefix}INFO:megatron.core.timers:(min, max) time across ranks (ms):"]
    lines += [
        prefix + "    {}: ({:.2f}, {:.2f})".format((name + " ").ljust(48, "."), lo, hi)
        for name, (lo, hi) in times.items()
    ]
    return "\n".join(lines)


def test_one_definition_of_a_training_iteration_line():
    """The log parser and the run launcher (which kills a run once a step is logged) read
    training-iteration lines through one definition: evaluation summaries do not count."""
    from bridge_recipes.bench import runs

    assert L.training_iteration_step(LINE) == 2
    assert L.training_iteration_step(" iteration        2/      20 | lm loss: 1.5 |") is None  # no step time
    assert L.training_iteration_step("validation loss at iteration 2 | lm loss value: 1.5") is None
    assert runs.training_iteration_step is L.training_iteration_step


def _step_line(step: int, ms: float) -> str:
    return LINE.replace("iteration        2/", f"iteration {step:8d}/").replace("9164.8", str(ms))


def test_timer_blocks_belong_to_the_step_printed_before_them():
    setup = _timer_block({"model-and-optimizer-setup": (251.13, 251.13)})
    text = "\n".join(
        [setup]
        + [
            f"{_step_line(s, 3000 + s)}\n"
            + _timer_block(
                {
                    "forward-backward": (2000.0 + s, 2500.0 + s),
                    "optimizer": (400.0, 410.5),
                    "all-grads-sync": (1.5, 1.5),
                }
            )
            for s in range(1, 5)
        ]
    )
    timers = L.parse_megatron_timers(text)
    assert sorted(timers) == [1, 2, 3, 4]  # the set-up block precedes every step: left out
    assert timers[3] == {"forward-backward": 2503.0, "optimizer": 410.5, "all-grads-sync": 1.5}  # max over ranks
    means = L.phase_time_means(text, (2, 4))
    assert means == pytest.approx({"forward-backward": 2.503, "optimizer": 0.4105})
    assert L.phase_time_means(text, (2, 5)) is None  # step 5 has no timers
    assert L.parse_megatron_timers("    optimizer ....: 12.50\n") == {}  # max-only lines, but no step yet
    assert L.parse_megatron_timers(_step_line(1, 10) + "\n    optimizer ..........: 12.50") == {1: {"optimizer": 12.5}}


# --- result file ---------------------------------------------------------------------------------


def _stand_in(**model):
    m = dict(
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None,
        context_parallel_size=1,
        expert_model_parallel_size=8,
        expert_tensor_parallel_size=1,
        sequence_parallel=False,
        num_layers_in_first_pipeline_stage=None,
        num_layers_in_last_pipeline_stage=None,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
        moe_token_dispatcher_type="alltoall",
        num_moe_experts=256,
        seq_length=8192,
        bf16=True,
        fp8=None,
    )
    m.update(model)
    return SimpleNamespace(
        model=SimpleNamespace(**m),
        train=SimpleNamespace(global_batch_size=128, micro_batch_size=2),
        optimizer=SimpleNamespace(
            optimizer_cpu_offload=True, optimizer_offload_fraction=1.0, overlap_cpu_optimizer_d2h_h2d=True
        ),
        dataset=SimpleNamespace(mock=True),
    )


def test_layout_of_a_stand_in_config():
    lay = R.layout_from_config(_stand_in(), world_size=8)
    assert lay == {
        "label": "TP1 PP1 EP8 ETP1 DP8",
        "tp": 1,
        "pp": 1,
        "vpp": 1,
        "cp": 1,
        "ep": 8,
        "etp": 1,
        "dp": 8,
        "sequence_parallel": False,
        "layer_split": None,
        "max_tokens_per_gpu": 16384,
        "rows_per_microbatch": 2,
        "recompute": {"granularity": "full", "method": "uniform", "num_layers": 1},
        "offload": {"optimizer_fraction": 1.0, "overlap_d2h_h2d": True},
        "dispatcher": "alltoall",
    }
    long_ctx = R.layout_from_config(
        _stand_in(tensor_model_parallel_size=2, context_parallel_size=2, sequence_parallel=True, seq_length=32768),
        world_size=8,
    )
    assert (long_ctx["dp"], long_ctx["label"], long_ctx["max_tokens_per_gpu"]) == (
        2,
        "TP2 PP1 CP2 EP8 ETP1 DP2",
        32768,
    )
    dense = R.layout_from_config(_stand_in(num_moe_experts=None, expert_model_parallel_size=1), world_size=8)
    assert dense["dispatcher"] is None and dense["label"] == "TP1 PP1 DP8"
    with pytest.raises(ValueError, match="multiple"):
        R.layout_from_config(_stand_in(pipeline_model_parallel_size=3), world_size=8)


@pytest.fixture(scope="module")
def cfg_27b():
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_27b_sft_8gpu_h200_bf16_config

    return qwen35_27b_sft_8gpu_h200_bf16_config()


def test_layout_and_workload_of_the_real_27b_recipe(cfg_27b):
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_27b_sft_8gpu_h200_bf16_config

    lay = R.layout_from_config(cfg_27b, world_size=8)
    assert lay["label"] == qwen35_27b_sft_8gpu_h200_bf16_config.recipe_meta.layout == "TP1 PP4 DP2"
    assert (lay["tp"], lay["pp"], lay["vpp"], lay["cp"], lay["ep"], lay["etp"], lay["dp"]) == (1, 4, 1, 1, 1, 1, 2)
    assert lay["layer_split"] == {"first": 16, "last": 14}  # openrecipes-27b-h200
    assert lay["recompute"] == {"granularity": "full", "method": "block", "num_layers": 12}
    assert lay["offload"] is None and lay["dispatcher"] is None
    assert (lay["rows_per_microbatch"], lay["max_tokens_per_gpu"], lay["sequence_parallel"]) == (1, 8192, False)
    work = R.workload_from_config(cfg_27b)
    assert (work["row_tokens"], work["global_batch"], work["precision"]) == (8192, 128, "bf16")


def test_a_result_counts_rows_when_rows_are_joined_into_one_sequence(cfg_27b):
    """Two 8,192-token rows joined into one 16,384-token sequence per micro batch: the layout and the
    workload speak of rows (two per micro batch, 128 per step), the tokens per micro batch are unchanged."""
    import copy
    from types import SimpleNamespace as NS

    cfg = copy.deepcopy(cfg_27b)
    cfg.model.seq_length, cfg.train.global_batch_size = 16384, 64
    cfg.dataset = NS(rows_per_sample=2, path="/rows")
    lay, work = R.layout_from_config(cfg, world_size=8), R.workload_from_config(cfg)
    assert (lay["rows_per_microbatch"], lay["max_tokens_per_gpu"]) == (2, 16384)
    assert (work["row_tokens"], work["global_batch"]) == (8192, 128)


def test_stack_versions_tolerate_missing_packages(monkeypatch):
    stack = R.stack_versions()
    assert stack["megatron_core"] == importlib.metadata.version("megatron-core")
    assert stack["pytorch"] == importlib.metadata.version("torch")
    assert stack["python"] == platform.python_version()
    assert {"transformer_engine", "megatron_bridge", "cuda", "nccl", "gpu_name"} <= set(stack)
    monkeypatch.setattr(R, "STACK_PACKAGES", {"pytorch": ("no-such-distribution-xyz",)})
    assert R.stack_versions()["pytorch"] is None


def test_result_file_round_trip(tmp_path):
    spec = get_spec("qwen35_35b_a3b")
    flops = F.model_flops_per_token(spec, 8192)
    st = S.summarize(
        _steps([170.0] + [2.0] * 19, tokens=128 * 8192),
        world_size=8,
        flops_per_token=flops.training_total,
        peak_flops="H200",
        six_n_flops_per_token=F.six_n_flops_per_token(spec),
    )
    path = tmp_path / "results" / "run.yaml"
    doc = R.write_result(
        path,
        recipe="qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config",
        model="Qwen3.6-35B-A3B",
        cfg=_stand_in(),
        stats=st,
        gpu="NVIDIA H200",
        flops=flops,
        measured=dt.date(2026, 11, 29),
        stack={"gpu_name": "NVIDIA H200"},
        command="torchrun ...",
        notes="synthetic",
    )
    back = R.read_result(path)
    assert back == doc
    assert list(back) == list(R.TOP_LEVEL_KEYS)
    assert back["gpu"] == {"type": "H200", "count": 8, "memory_gb": 141}
    res = back["result"]
    assert res["tokens_per_s_per_gpu"] == round(128 * 8192 / 2.0 / 8, 2) == 65536.0
    assert res["window"] == [5, 19] and res["window_tokens"] == 15 * 128 * 8192 and res["steps_per_run"] == 20
    assert res["step_time_cv_percent"] == 0.0 and res["measured"] == dt.date(2026, 11, 29)
    assert res["flops_per_token"]["six_n"] == 6 * 2_946_252_800
    assert res["active_params"] == {"count": 2_946_252_800}
    assert res["flops_per_token"]["model"] == round(flops.training_total)
    assert sum(res["flops_per_token"]["breakdown"].values()) == pytest.approx(flops.training_total, abs=20)
    assert res["mfu"] == round(65536 * flops.training_total / 989.4e12, 4)
    assert res["mfu_6n"] == round(65536 * 6 * 2_946_252_800 / 989.4e12, 4)
    assert back["workload"] == {
        "row_tokens": 8192,
        "global_batch": 128,
        "precision": "bf16",
        "dataset": {"name": "mock", "source": None},
    }
    assert back["stack"]["megatron_core"] == importlib.metadata.version("megatron-core")


def _small_result(tmp_path, recipe: str) -> dict:
    st = S.summarize(_steps([2.0] * 20, tokens=8192), world_size=1, flops_per_token=1.0, peak_flops="H200")
    return R.write_result(tmp_path / "r.yaml", recipe=recipe, model="m", cfg=_stand_in(), stats=st, gpu="H200")


def test_a_result_records_the_fingerprint_of_the_recipe_it_measured(tmp_path):
    """The fingerprint is the fingerprint test's, of the recipe as it builds now; a name that is no recipe
    has none; a result file written before results recorded it still reads."""
    import json
    from pathlib import Path

    name = "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config"
    committed = json.loads((Path(__file__).with_name("recipe_configs.json")).read_text())[name]
    doc = _small_result(tmp_path, name)
    assert doc["fingerprint"] == committed and set(committed) == {"recipe", "rows"}
    assert R.read_result(tmp_path / "r.yaml")["fingerprint"] == committed
    assert _small_result(tmp_path, "not_a_recipe")["fingerprint"] is None
    older = (tmp_path / "r.yaml").read_text().replace("fingerprint: null\n", "")
    assert "fingerprint" not in older
    (tmp_path / "r.yaml").write_text(older)
    assert "fingerprint" not in R.read_result(tmp_path / "r.yaml")


def test_read_result_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 2\n")
    with pytest.raises(ValueError, match="schema_version"):
        R.read_result(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ValueError, match="not a result file"):
        R.read_result(bad)
    bad.write_text("schema_version: 1\nrecipe: x\n")
    with pytest.raises(ValueError, match="missing top-level keys"):
        R.read_result(bad)


def test_published_step_seconds_of_the_27b_recipes(cfg_27b):
    """128 rows of 8,192 tokens on 8 GPUs at the openrecipes-27b-h200 rates: 52.4 s tuned, 138.2 s reference;
    without a published rate, the recipe's measured one; without either, None."""
    from bridge_recipes.bench.harness import published_step_seconds
    from bridge_recipes.recipes import registry

    tuned = published_step_seconds(cfg_27b, registry.find("qwen35_27b_sft_8gpu_h200_bf16_config"))
    assert tuned == pytest.approx(128 * 8192 / (2499.5 * 8)) and round(tuned, 1) == 52.4
    ref = registry.find("qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config")
    assert published_step_seconds(cfg_27b, ref) == pytest.approx(138.15, abs=0.01)
    assert registry.measured_rate(ref.name) is None
    assert published_step_seconds(cfg_27b, replace(ref, meta=replace(ref.meta, reference=None))) is None
    peft = registry.find("qwen35_27b_peft_1gpu_h200_bf16_config")
    measured = registry.measured_rate(peft.name)
    assert peft.meta.reference is None and measured and peft.meta.gpus == 1
    assert published_step_seconds(cfg_27b, peft) == pytest.approx(128 * 8192 / measured)
    alias = registry.find("qwen36_27b_peft_1gpu_h200_bf16_config")  # the same config: its recipe's rate
    assert alias.alias_of == peft.name and published_step_seconds(cfg_27b, alias) == pytest.approx(
        128 * 8192 / measured
    )
