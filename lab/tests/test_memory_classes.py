"""The lab's LoRA comparison runs both sides under the memory cap of the recipe's card."""

from __future__ import annotations

import argparse


def test_both_runs_of_a_comparison_take_the_cap_of_the_recipes_card(tmp_path):
    from lab import lora_vs_peft

    opts = argparse.Namespace(
        rows=str(tmp_path), steps=20, window=[5, 19], overrides=[], global_batch=2, gpu_memory_gb="auto"
    )
    name = "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config"
    from bridge_recipes.hardware.gpus import class_memory_gb

    card = class_memory_gb("l40s")  # what an L40S reports, below its name's 48 GB
    assert lora_vs_peft.memory_cap(name, opts) == card < 48.0
    for argv in (
        lora_vs_peft.benchmark_argv(name, opts, tmp_path / "o.yaml"),
        lora_vs_peft.peer_argv(name, opts, None),
    ):
        assert argv[argv.index("--gpu-memory-gb") + 1] == f"{card:g}"
    line = {"peer_tokens_per_s": None}
    oom = {"error": "out of memory: CUDA out of memory. Tried to allocate 1024.00 MiB"}
    ours = {"result": {"useful_tokens_per_s_per_gpu": 1000.0}}
    fields = lora_vs_peft.memory_class_fields(name, opts, ours, oom, line)
    assert fields == {
        "gpu": "l40s",
        "memory_cap_gb": card,
        "speed_of": "l40s",
        "base_precision": "fp8",
        "base_compute": "bf16",
        "ours_useful_tokens_per_s": 1000.0,
        "peer_fits": False,
    }
    assert (
        lora_vs_peft.memory_class_fields(name, opts, ours, {"error": "peer_peft exited 2"}, line)["peer_fits"] is None
    )
    # ours' config with features.fp8_base.gemms=fp8 applied
    assert lora_vs_peft.memory_class_fields(name, opts, ours, oom, line, "fp8")["base_compute"] == "fp8"
    on_h200 = lora_vs_peft.memory_class_fields(name, opts, {**ours, "gpu": {"type": "H200"}}, oom, line)
    assert on_h200["speed_of"] == "h200, not l40s"
    opts.gpu_memory_gb = None
    assert lora_vs_peft.memory_cap(name, opts) is None and "--gpu-memory-gb" not in lora_vs_peft.peer_argv(
        name, opts, None
    )
