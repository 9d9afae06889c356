"""python -m lab.startup_breakdown (lab.startup) puts each profile sample in
the first matching phase."""

from lab import startup as sb


def _frame(file, name="f"):
    return {"file": file, "name": name}


def test_samples_go_to_the_first_matching_phase():
    frames = [
        _frame("megatron/bridge/training/train.py"),
        _frame("triton/runtime/autotuner.py"),
        _frame("torch/_inductor/compile_fx.py"),
        _frame("<frozen importlib._bootstrap>", "_find_and_load"),
        _frame("/tmp/site/tilelang/jit/kernel.py"),
    ]
    profile = {
        "shared": {"frames": frames},
        "profiles": [{"samples": [[0, 1], [0, 1], [0, 2, 1], [3], [0, 4, 1], [0]]}],
    }
    got = sb.breakdown(profile, rate=2.0)  # each sample is half a second
    assert got == {
        "triton compile + autotune (FLA kernels)": 1.0,
        "torch.compile (dynamo, inductor)": 0.5,
        "python imports": 0.5,
        "tilelang compile": 0.5,
        "other (set-up, training steps, data)": 0.5,
    }
