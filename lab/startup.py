"""Where a training process's start-up went, from a py-spy speedscope profile
(python -m lab.startup_breakdown prints and writes it).

Each sample (all processes and threads; py-spy records active samples only) is put in the
first matching phase: TileLang kernel compilation, torch.compile (Dynamo tracing, Inductor
compile and autotuning), Triton kernel compile and autotuning outside Inductor (the FLA Gated
DeltaNet kernels), Python imports, checkpoint I/O, everything else.
"""

from __future__ import annotations

from collections import Counter

PHASES = (  # (phase, substrings of a frame's file or name; first phase with a match wins)
    ("tilelang compile", ("/tilelang/",)),
    (
        "torch.compile (dynamo, inductor)",
        (
            "torch/_dynamo/convert_frame.py",
            "torch/_inductor/compile_fx.py",
            "torch/_inductor/runtime/triton_heuristics.py",
            "torch/_inductor/async_compile.py",
        ),
    ),
    ("triton compile + autotune (FLA kernels)", ("triton/runtime/autotuner.py", "triton/compiler/")),
    ("python imports", ("<frozen importlib._bootstrap>",)),
    ("checkpoint i/o", ("dist_checkpointing",)),
)


def phase_of(stack: list[dict]) -> str:
    text = [f"{f.get('file', '')} {f.get('name', '')}" for f in stack]
    for phase, keys in PHASES:
        if any(k in t for t in text for k in keys):
            return phase
    return "other (set-up, training steps, data)"


def breakdown(profile: dict, rate: float) -> dict[str, float]:
    frames = profile["shared"]["frames"]
    seconds: Counter = Counter()
    for prof in profile["profiles"]:
        for sample in prof["samples"]:
            seconds[phase_of([frames[i] for i in sample])] += 1 / rate
    return {k: round(v, 1) for k, v in seconds.most_common()}
