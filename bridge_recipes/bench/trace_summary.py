"""Where a step's GPU time goes, from a torch profiler trace (Megatron-Bridge's
``profiling.use_pytorch_profiler``: ``{tensorboard_dir}/../torch_profile/rank-N.json.gz``).

    python -m bridge_recipes.bench.trace_summary TRACE.json.gz [--steps N]

Every GPU kernel, copy and memset of the trace is put in one category by its name (first match in
:data:`CATEGORIES` order), and the summary gives each category's milliseconds, the GPU's busy time
(the union of all kernel intervals, streams overlapping), the time communication kernels ran
while a compute kernel also ran (hidden behind it) and the time they ran alone (exposed), and the
idle time of the traced window. Kernel names are those of the H200 stack (cuBLAS/CUTLASS GEMMs,
Transformer Engine and cuDNN attention, the FLA Triton kernels of Gated DeltaNet, NCCL).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

# (category, pattern on the kernel name), first match wins: optimizer kernels before the FLA
# patterns (both have norms), communication first of all.
ALL_TO_ALL = "nccl all-to-all / send-recv"
CATEGORIES: tuple[tuple[str, str], ...] = (
    (ALL_TO_ALL, r"nccl.*(alltoall|sendrecv|send|recv)"),
    ("nccl all-reduce", r"nccl.*allreduce"),
    ("nccl reduce-scatter", r"nccl.*reducescatter"),
    ("nccl all-gather", r"nccl.*allgather"),
    ("nccl other", r"nccl"),
    ("optimizer", r"multi_tensor|adam"),
    # before the GEMMs: cuDNN's attention kernels name their wgmma tiles
    ("attention", r"sdpa|flash|fmha|attn|cudnn"),
    ("gemm", r"gemm|xmma|cutlass|nvjet|cublas|wgmma"),
    ("gated deltanet (fla)", r"delta|chunk_|causal_conv|l2norm|recompute_w_u|solve_tril|merge_16x16|fused_recurrent"),
    ("moe routing and permute", r"permute|topk|router|moe|sort|histogram"),
    # copies and memsets by their own names, not Inductor's fused kernels that happen to copy
    ("copy and memset", r"^memcpy|^memset|copy_kernel"),
)
OTHER = "other (elementwise, norms, softmax, ...)"
COMM_PREFIX = "nccl"
# the host's calls into the CUDA runtime and driver (kernel launches, copies, synchronizations)
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")
# the host's own work the profiler records: PyTorch operators and, where stacks were recorded, Python
# functions; each is charged its self time (its duration less that of the events nested in it on its thread)
HOST_WORK_CATEGORIES = ("cpu_op", "python_function")
SYNC = re.compile(r"synchronize|memcpy(?!.*async)", re.IGNORECASE)  # calls that wait for the GPU
LAUNCH = re.compile(r"(?:cuda|cu)Launch(?:Cooperative)?Kernel|GraphLaunch", re.IGNORECASE)
TOP_KERNELS = 20  # the kernels a summary lists by their time, longest first
TOP_NAME_CHARS = 120  # templated kernel names run to thousands of characters
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


class TraceError(ValueError):
    """A file that is not a torch profiler trace with GPU kernels; the message names it."""


def category(name: str) -> str:
    low = name.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, low):
            return label
    return OTHER


def _load(path: Path) -> list[dict[str, Any]]:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        doc = json.loads(raw)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: not a JSON trace ({type(exc).__name__}: {exc})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list")
    return events


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total overlap of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _complete(events: list[dict[str, Any]], categories: tuple[str, ...]) -> list[dict[str, Any]]:
    """The trace's complete events (with a duration) of ``categories``."""
    return [
        e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in categories and "dur" in e
    ]


def _by_name(events: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each event name's [microseconds, count] over ``events``."""
    tally: dict[str, list[float]] = {}
    for e in events:
        t = tally.setdefault(str(e.get("name", "")), [0.0, 0])
        t[0] += float(e["dur"])
        t[1] += 1
    return tally


def _top(tally: dict[str, list[float]]) -> list[tuple[str, float, float]]:
    """A tally's TOP_KERNELS names with the most time, longest first, as (name, microseconds, count)."""
    return [(n, us, k) for n, (us, k) in sorted(tally.items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]]


def summarize(events: list[dict[str, Any]], steps: int = 1) -> dict[str, Any]:
    """The breakdown of ``events`` (torch profiler chrome-trace events), per step over ``steps``."""
    gpu = _complete(events, GPU_CATEGORIES)
    if not gpu:
        raise TraceError("the trace has no GPU kernel events (was the profiler's CUDA activity on?)")
    per: dict[str, float] = {}
    by_name = _by_name(gpu)
    comm, compute = [], []
    for e in gpu:
        label = category(str(e.get("name", "")))
        per[label] = per.get(label, 0.0) + float(e["dur"])
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        (comm if label.startswith(COMM_PREFIX) else compute).append(span)
    comm_u, compute_u = _union(comm), _union(compute)
    busy = _union(comm + compute)
    window = max(e for _, e in busy) - min(s for s, _ in busy)
    hidden = _intersection(comm_u, compute_u)
    ms = 1e-3 / steps  # trace times are microseconds
    total = sum(per.values())
    return {
        "steps": steps,
        "window_ms": round(window * ms, 3),
        "busy_ms": round(_length(busy) * ms, 3),
        "idle_ms": round((window - _length(busy)) * ms, 3),
        "communication_ms": round(_length(comm_u) * ms, 3),
        "communication_hidden_ms": round(hidden * ms, 3),
        "communication_exposed_ms": round((_length(comm_u) - hidden) * ms, 3),
        "categories_ms": {k: round(v * ms, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1])},
        "categories_share": {k: round(v / total, 4) for k, v in sorted(per.items(), key=lambda kv: -kv[1])},
        # GPU activities (kernels, copies, memsets) per step and their mean length: many short ones with idle
        # gaps between them point at the host's launches, few long ones at the kernels
        "kernels_per_step": round(len(gpu) / steps, 1),
        "mean_kernel_us": round(total / len(gpu), 2),
        "top_kernels": [
            {
                "name": n[:TOP_NAME_CHARS],
                "category": category(n),
                "ms": round(us * ms, 3),
                "launches": round(k / steps, 1),
            }
            for n, us, k in _top(by_name)
        ],
        "host": _host(events, steps),
    }


def _host(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The host's side of the window: its calls into the CUDA runtime and driver by name (milliseconds
    and calls a step), the time it spent launching kernels and the time it waited for the GPU
    (synchronizations and blocking copies). A host that launches slower than the GPU runs shows long
    launch time and short waits; one held by synchronizations, the reverse."""
    calls = _by_name(_complete(events, HOST_CATEGORIES))
    ms = 1e-3 / steps
    work = _self_times(_complete(events, HOST_CATEGORIES + HOST_WORK_CATEGORIES))
    launch_us, launches = _matching(calls, LAUNCH)
    wait_us, waits = _matching(calls, SYNC)
    return {
        "runtime_ms": round(sum(us for us, _ in calls.values()) * ms, 3),
        "launch_ms": round(launch_us * ms, 3),
        "launches": round(launches / steps, 1),
        "wait_ms": round(wait_us * ms, 3),
        "waits": round(waits / steps, 1),
        "calls": {n: {"ms": round(us * ms, 3), "calls": round(k / steps, 1)} for n, us, k in _top(calls)},
        # where the rest of the host's time goes: operators and Python functions by their self time
        "work": {
            cat: {
                "self_ms": round(sum(us for us, _ in tally.values()) * ms, 3),
                "top": {n: {"self_ms": round(us * ms, 3), "calls": round(k / steps, 1)} for n, us, k in _top(tally)},
            }
            for cat, tally in work.items()
        },
    }


def _matching(tally: dict[str, list[float]], pattern: re.Pattern[str]) -> tuple[float, float]:
    """The microseconds and count of a tally's names that ``pattern`` matches (each name matched once)."""
    matched = [(us, k) for n, (us, k) in tally.items() if pattern.search(n)]
    return sum(us for us, _ in matched), sum(k for _, k in matched)


def _self_times(events: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Each host-work category's {name (cut to TOP_NAME_CHARS): [self microseconds, count]}: an event's self
    time is its duration less the parts of it that events nested in it on the same thread cover (runtime
    calls included, so an operator's launches are not its own work). Times are compared in whole
    nanoseconds; an event that outlasts the one it starts in (clock skew between the profiler's sources)
    is charged to that one only for the overlap, and no self time goes below zero."""
    by_thread: dict[tuple[Any, Any], list[tuple[int, int, dict[str, Any]]]] = {}
    for e in events:
        start = round(float(e["ts"]) * 1000)
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(
            (start, start + round(float(e["dur"]) * 1000), e)
        )
    out: dict[str, dict[str, list[float]]] = {}
    for thread in by_thread.values():
        thread.sort(key=lambda t: (t[0], -t[1]))
        own = [float(end - start) for start, end, _ in thread]
        stack: list[int] = []  # indices of the open events, innermost last
        for i, (start, end, _) in enumerate(thread):
            while stack and thread[stack[-1]][1] <= start:
                stack.pop()
            if stack:
                own[stack[-1]] -= min(end, thread[stack[-1]][1]) - start
            stack.append(i)
        for (_, _, e), ns in zip(thread, own):
            if e.get("cat") in HOST_WORK_CATEGORIES:
                name = str(e.get("name", ""))[:TOP_NAME_CHARS]
                t = out.setdefault(str(e["cat"]), {}).setdefault(name, [0.0, 0])
                t[0] += max(ns, 0.0) / 1000
                t[1] += 1
    return out


def summarize_file(path: str | Path, steps: int = 1) -> dict[str, Any]:
    path = Path(path)
    try:
        return summarize(_load(path), steps)
    except TraceError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise TraceError(f"{path}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=1, help="training steps the trace holds (per-step figures)")
    args = p.parse_args(argv)
    if args.steps < 1:
        print(f"trace_summary: --steps {args.steps}: at least 1", file=sys.stderr)
        return 2
    try:
        print(json.dumps(summarize_file(args.trace, args.steps), indent=1))
    except TraceError as exc:
        print(f"trace_summary: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
