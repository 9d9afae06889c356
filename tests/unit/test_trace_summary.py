"""bridge_recipes.bench.trace_summary on small hand-written traces: categories by kernel name,
busy and idle time, communication hidden behind compute or exposed, and its refusals."""

from __future__ import annotations

import gzip
import json

import pytest

from bridge_recipes.bench.trace_summary import OTHER, TraceError, category, main, summarize, summarize_file


def kernel(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "nccl all-to-all / send-recv"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "nccl reduce-scatter"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x256_1x4x1_cga1x1", "attention"),
        ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "gated deltanet (fla)"),
        ("causal_conv1d_fwd_kernel", "gated deltanet (fla)"),
        ("multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor>", "optimizer"),
        ("_permute_kernel", "moe routing and permute"),
        ("Memcpy DtoD (Device -> Device)", "copy and memset"),
        ("Memset (Device)", "copy and memset"),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>",
            "copy and memset",
        ),
        ("triton_red_fused_copy__exp_sub_sum_unsqueeze_2", OTHER),
        ("vectorized_elementwise_kernel<4, BinaryFunctor>", OTHER),
    ],
)
def test_kernels_fall_in_their_category(name, expected):
    assert category(name) == expected


def test_busy_idle_and_hidden_communication():
    events = [
        kernel("sm90_xmma_gemm", 0, 100),
        kernel("ncclDevKernel_SendRecv", 50, 100),  # 50 us under the GEMM, 50 alone
        kernel("chunk_fwd_kernel_o", 200, 50),  # 50 us idle before it
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000},  # host side: not counted
    ]
    s = summarize(events)
    assert s["window_ms"] == 0.25 and s["busy_ms"] == 0.2 and s["idle_ms"] == 0.05
    assert (s["communication_ms"], s["communication_hidden_ms"], s["communication_exposed_ms"]) == (0.1, 0.05, 0.05)
    assert s["categories_ms"] == {"gemm": 0.1, "nccl all-to-all / send-recv": 0.1, "gated deltanet (fla)": 0.05}
    assert summarize(events, steps=2)["busy_ms"] == 0.1
    assert (s["kernels_per_step"], s["mean_kernel_us"]) == (3, 83.33)
    assert [(k["name"], k["ms"], k["launches"]) for k in s["top_kernels"]][:2] == [
        ("sm90_xmma_gemm", 0.1, 1),
        ("ncclDevKernel_SendRecv", 0.1, 1),
    ]


def test_top_kernels_add_launches_of_one_name_and_cut_long_names():
    long = "void at::native::elementwise_kernel<" + "x" * 500 + ">"
    events = [kernel(long, 10 * i, 5) for i in range(4)] + [kernel("chunk_fwd_kernel_o", 100, 12)]
    s = summarize(events, steps=2)
    top = s["top_kernels"]
    assert top[0]["launches"] == 2 and top[0]["ms"] == 0.01 and len(top[0]["name"]) == 120
    assert top[1] == {"name": "chunk_fwd_kernel_o", "category": "gated deltanet (fla)", "ms": 0.006, "launches": 0.5}
    assert s["kernels_per_step"] == 2.5


def test_gzip_file_and_the_command(tmp_path, capsys):
    path = tmp_path / "rank-0.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": [kernel("gemm", 0, 1000)]}).encode()))
    assert summarize_file(path)["categories_share"] == {"gemm": 1.0}
    assert main([str(path), "--steps", "1"]) == 0 and '"busy_ms": 1.0' in capsys.readouterr().out


def test_refusals_name_the_file(tmp_path, capsys):
    with pytest.raises(TraceError, match="no such file"):
        summarize_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TraceError, match="not a JSON trace"):
        summarize_file(bad)
    cpu_only = tmp_path / "cpu.json"
    cpu_only.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}]}))
    assert main([str(cpu_only)]) == 2
    assert f"{cpu_only}: the trace has no GPU kernel events" in capsys.readouterr().err


def test_the_host_side_counts_launches_and_waits():
    """The runtime and driver calls: launches (cudaLaunchKernel, Triton's cuLaunchKernel) and what waits for
    the GPU (synchronizations, blocking copies; an async copy does not wait)."""
    host = [
        kernel("cudaLaunchKernel", 0, 4, cat="cuda_runtime"),
        kernel("cudaLaunchKernel", 10, 6, cat="cuda_runtime"),
        kernel("cuLaunchKernel", 20, 6, cat="cuda_driver"),
        kernel("cuLaunchHostFunc", 28, 2, cat="cuda_driver"),  # runs host code: not a kernel launch
        kernel("cudaStreamSynchronize", 30, 100, cat="cuda_runtime"),
        kernel("cudaMemcpyAsync", 140, 2, cat="cuda_runtime"),
        kernel("cudaMemcpy", 150, 20, cat="cuda_runtime"),
        kernel("aten::add_", 0, 50, cat="cpu_op"),  # the host's own work: not a runtime call
    ]
    s = summarize([kernel("gemm", 0, 10), *host], steps=2)["host"]
    assert (s["launches"], s["launch_ms"]) == (1.5, 0.008)
    assert (s["waits"], s["wait_ms"]) == (1, 0.06)
    assert s["runtime_ms"] == 0.07 and s["calls"]["cudaLaunchKernel"] == {"ms": 0.005, "calls": 1}
    assert list(s["calls"])[0] == "cudaStreamSynchronize"


def test_the_host_side_charges_operators_their_self_time():
    """An operator's self time is its duration less what is nested in it on its thread: a child operator
    and the runtime calls it makes; another thread's events do not count against it."""
    events = [
        kernel("gemm", 0, 10),
        {**kernel("aten::linear", 0, 100, cat="cpu_op"), "tid": 1},
        {**kernel("aten::mm", 10, 30, cat="cpu_op"), "tid": 1},
        {**kernel("cudaLaunchKernel", 20, 8, cat="cuda_runtime"), "tid": 1},
        {**kernel("cudaLaunchKernel", 50, 10, cat="cuda_runtime"), "tid": 1},
        {**kernel("aten::mm", 120, 40, cat="cpu_op"), "tid": 1},
        {**kernel("aten::add_", 10, 500, cat="cpu_op"), "tid": 2},  # another thread
        {**kernel("megatron/core/x.py(1): forward", 0, 200, cat="python_function"), "tid": 1},
    ]
    work = summarize(events, steps=2)["host"]["work"]
    ops = work["cpu_op"]["top"]
    assert ops["aten::linear"] == {"self_ms": 0.03, "calls": 0.5}  # 100 - 30 - 10 us, over 2 steps
    assert ops["aten::mm"] == {"self_ms": 0.031, "calls": 1}  # (30 - 8) + 40 us
    assert ops["aten::add_"]["self_ms"] == 0.25
    assert work["cpu_op"]["self_ms"] == 0.311
    assert work["python_function"]["top"]["megatron/core/x.py(1): forward"]["self_ms"] == 0.03  # 200 - 100 - 40


def test_host_self_times_survive_skewed_adjacent_and_empty_events():
    """A child that outlasts its parent (clock skew) is charged to it for the overlap only; an event that
    starts exactly when another ends is its sibling; a zero-length event changes nothing; no self time is
    negative; names cut to the same prefix add up."""
    long = "x" * 200
    events = [
        kernel("gemm", 0, 10),
        {**kernel("aten::a", 0, 100, cat="cpu_op"), "tid": 1},
        {**kernel("aten::b", 50, 100, cat="cpu_op"), "tid": 1},  # runs 50 us past aten::a
        {**kernel("aten::c", 150, 20, cat="cpu_op"), "tid": 1},  # starts as aten::b ends: a sibling
        {**kernel("aten::d", 160, 0, cat="cpu_op"), "tid": 1},
        {**kernel(long + "1", 300, 10, cat="cpu_op"), "tid": 1},
        {**kernel(long + "2", 400, 10, cat="cpu_op"), "tid": 1},
    ]
    ops = summarize(events)["host"]["work"]["cpu_op"]["top"]
    assert ops["aten::a"]["self_ms"] == 0.05 and ops["aten::b"]["self_ms"] == 0.1
    assert ops["aten::c"]["self_ms"] == 0.02 and ops["aten::d"]["self_ms"] == 0
    assert ops["x" * 120] == {"self_ms": 0.02, "calls": 2}
