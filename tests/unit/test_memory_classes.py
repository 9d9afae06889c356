"""LoRA on the GPUs people have: the 80 GB and 48 GB recipes, the FP8 base, the GPU checks and the cap."""

from __future__ import annotations

import re
import sys

import pytest

from bridge_recipes.bench.harness import BENCHMARK_OVERRIDES
from bridge_recipes.features import fp8_base
from bridge_recipes.hardware import gpu_memory
from bridge_recipes.hardware.gpu_memory import Device
from bridge_recipes.hardware.gpus import GPUS, class_memory_gb, class_names
from bridge_recipes.plan import memory as M
from bridge_recipes.recipes import gpu_fit, registry
from bridge_recipes.runner.cli import main

CLASSES = {
    "qwen35_27b_peft_1gpu_h100_fp8base_config": ("h100", True),
    "qwen35_35b_a3b_peft_1gpu_h100_bf16_config": ("h100", False),
    "qwen35_27b_peft_1gpu_a100_bf16_config": ("a100", False),
    "qwen35_35b_a3b_peft_1gpu_a100_bf16_config": ("a100", False),
    "qwen35_27b_peft_1gpu_l40s_fp8base_config": ("l40s", True),
    "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config": ("l40s", True),
}
A100 = Device("NVIDIA A100-SXM4-80GB", 79.15 * 2**30 / 1e9, (8, 0))  # what each reports to torch
H100 = Device("NVIDIA H100 80GB HBM3", 79.18 * 2**30 / 1e9, (9, 0))
L40S = Device("NVIDIA L40S", 44.42 * 2**30 / 1e9, (8, 9))
H200 = Device("NVIDIA H200", 139.80 * 2**30 / 1e9, (9, 0))


def build(name):
    return registry.load(name)()


def test_the_gpu_table_knows_the_cards_and_their_classes():
    assert not GPUS["A100"].fp8 and GPUS["H100"].fp8 and GPUS["L40S"].fp8
    assert class_names("l40s") == ("l40s", "rtx6000ada", "48gb")
    assert class_names("NVIDIA-H100") == ("h100", "80gb")
    # what the cards report to torch (79.18, 79.15 and 44.42 GiB), a printed step below: within each card
    assert [round(class_memory_gb(g), 2) for g in ("h100", "a100", "l40s")] == [85.01, 84.98, 47.68]
    assert class_memory_gb("v100") is None
    assert class_memory_gb("l40s") < 44.42 * 2**30 / 1e9 < 48.0
    assert {k: M.gpu_memory(k) for k in ("a100", "l40s")} == {
        "a100": GPUS["A100"].usable_memory_gb,
        "l40s": GPUS["L40S"].usable_memory_gb,
    }


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_memory_class_recipe_is_planned_to_fit_its_card(name):
    gpu, fp8 = CLASSES[name]
    entry = registry.find(name)
    cfg = build(name)
    assert (entry.meta.gpu, entry.meta.gpus, entry.meta.task) == (gpu, 1, "peft")
    assert M.fp8_frozen_base(cfg) is fp8 and gpu_fit.uses_fp8(cfg) is fp8
    plan = M.plan_memory(cfg, 1, gpu=gpu)
    assert plan.fits, (name, plan.peak_gb, plan.gpu_memory_gb)
    assert fp8_base.problems(cfg) == []


def test_the_fp8_base_halves_the_linear_weights_in_the_plan():
    """The 48 GB 27B recipe holds what the 80 GB A100 one does at two bytes per weight, less one byte per
    linear weight of the 64 layers and the MTP layer (the norms, embedding and output layer stay BF16)."""
    fp8, bf16 = build("qwen35_27b_peft_1gpu_l40s_fp8base_config"), build("qwen35_27b_peft_1gpu_a100_bf16_config")
    d, par = M.model_dims(bf16.model), M.parallel_layout(bf16, 1)
    layers = list(range(bf16.model.num_layers))
    saved = M.linear_params(d, par, layers) + M.mtp_linear_params(d, par)
    assert 24e9 < saved < 27e9  # most of the 27B's 27e9 parameters
    w8, w16 = (M.plan_memory(c, 1).stages[0].weights_gb for c in (fp8, bf16))
    assert w16 - w8 == pytest.approx(saved / 1e9)
    assert M.fp8_base_saving_bytes(bf16, d, par, layers, 0) == 0


def test_the_h200_recipes_do_not_fit_the_smaller_cards():
    fast = build("qwen35_35b_a3b_peft_1gpu_h200_bf16_config")
    assert not M.plan_memory(fast, 1, gpu="h100").fits and not M.plan_memory(fast, 1, gpu="l40s").fits


def test_filter_finds_recipes_by_card_class_and_whole_status_words(capsys):
    assert main(["--list", "--filter", "rtx6000ada"]) == 0
    out = capsys.readouterr().out
    assert "qwen35_27b_peft_1gpu_l40s_fp8base_config" in out and "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config" in out
    assert "_h200_" not in out
    entries = registry.entries().values()
    assert {e.name for e in entries if registry.matches(e, ["80gb", "peft"])} >= {
        n for n, (gpu, _) in CLASSES.items() if gpu != "l40s"
    }
    measured = [e for e in entries if registry.matches(e, ["measured"])]
    assert measured and all(e.meta.status == "measured" for e in measured)


# --- the FP8 base ---------------------------------------------------------------------------------


def test_the_fp8_base_needs_current_scaling():
    cfg = build("qwen35_27b_peft_1gpu_l40s_fp8base_config")
    cfg.mixed_precision.fp8_recipe = "delayed"
    (problem,) = fp8_base.problems(cfg)
    assert "fp8_recipe='delayed'" in problem and "mixed_precision.fp8_recipe=tensorwise" in problem
    from bridge_recipes.runner import checks

    assert any("tensorwise" in str(p) for p in checks.errors(checks.check(cfg, 1)))
    assert fp8_base.problems(build("qwen35_27b_peft_1gpu_a100_bf16_config")) == []


def test_an_fp8_base_multiplies_in_bf16_unless_its_config_says_fp8():
    assert fp8_base.Config().gemms == "bf16"
    cfg = build("qwen35_27b_peft_1gpu_l40s_fp8base_config")
    assert fp8_base.problems(cfg) == []
    cfg.features.fp8_base.gemms = "int8"
    (problem,) = fp8_base.problems(cfg)
    assert re.search(rf"^{fp8_base.KEY}='int8'.*one of bf16, fp8.*{fp8_base.KEY}=bf16", problem)


def test_fp8_is_refused_on_a_gpu_without_it_naming_the_key_and_the_choice():
    from bridge_recipes.runner import checks

    cfg = build("qwen35_27b_peft_1gpu_l40s_fp8base_config")
    assert fp8_base.problems(cfg, (8, 9)) == [] and fp8_base.problems(cfg, (9, 0)) == []
    (problem,) = fp8_base.problems(cfg, (8, 0), "A100")
    assert "compute capability 8.0 (A100)" in problem and "mixed_precision=bf16_mixed" in problem
    import bridge_recipes

    ampere = bridge_recipes.build(
        "qwen35_27b_peft_1gpu_a100_bf16_config", overrides=["mixed_precision=bf16_with_fp8_current_scaling_mixed"]
    )
    assert any("compute capability 8.0" in str(p) for p in checks.errors(checks.check(ampere, 1)))
    assert not checks.errors(checks.check(build("qwen35_27b_peft_1gpu_a100_bf16_config"), 1))


def test_bf16_compute_keeps_fp8_weight_creation_and_drops_the_autocast():
    import contextlib

    calls = []
    factory = fp8_base.without_fp8_autocast(lambda config, layer_no=-1, is_init=False: calls.append(is_init) or "fp8")
    assert fp8_base.without_fp8_autocast(factory) is factory
    assert isinstance(factory("config"), contextlib.nullcontext) and calls == []
    assert isinstance(factory("config", 3), contextlib.nullcontext) and calls == []
    assert factory("config", 3, True) == "fp8" and factory("config", is_init=True) == "fp8" and calls == [True, True]


@pytest.mark.parametrize("how", ["bf16", "fp8"])
def test_the_patch_drops_megatron_fp8_autocast_for_bf16_compute_only(monkeypatch, how):
    from megatron.bridge.models import model_provider
    from megatron.core import fp8_utils, recompute
    from megatron.core.transformer import multi_token_prediction, transformer_block

    from bridge_recipes.features import fp8_base as patch

    binders = (fp8_utils, transformer_block, recompute, multi_token_prediction)
    for module, name in ((model_provider, "_create_model"), (fp8_utils, "get_fp8_recipe")):
        monkeypatch.setattr(module, name, getattr(module, name))
    # every binding put back after the test (Megatron's modules only: another may raise on getattr)
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "megatron" and getattr(module, "get_fp8_context", None) is fp8_utils.get_fp8_context:
            monkeypatch.setattr(module, "get_fp8_context", module.get_fp8_context)
    cfg = build("qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config")
    cfg.features.fp8_base.gemms = how
    line = patch.install(cfg)
    wrapped = [getattr(m.get_fp8_context, "without_autocast", False) for m in binders]
    assert wrapped == [how == "bf16"] * len(binders)
    assert len({id(m.get_fp8_context) for m in binders}) == 1  # one wrapper, every binding
    assert ("GEMMs in BF16" in line) == (how == "bf16")
    assert getattr(fp8_utils.get_fp8_recipe, "dequantizes_backward", False)


def test_bf16_compute_plans_a_recomputed_layer_of_dequantized_weights():
    cfg = build("qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config")
    cfg.features.fp8_base.gemms = "bf16"
    bf16 = M.plan_memory(cfg, 1)
    cfg.features.fp8_base.gemms = "fp8"
    fp8 = M.plan_memory(cfg, 1)
    # a layer's 256 experts (three 2,048 x 512 matrices each) and its attention or Gated DeltaNet linears,
    # against the largest grouped linear alone (the experts' gate and up projections)
    added = bf16.stages[0].backward_gb - fp8.stages[0].backward_gb
    assert 0.5 < added < 1.5, added


def test_the_patched_upstream_code_is_what_the_patches_were_written_for(monkeypatch):
    from megatron.bridge.models import model_provider

    from bridge_recipes.features import fp8_base as patch
    from bridge_recipes.patches import contract

    assert contract.problems(patch.PATCH) == []
    monkeypatch.setattr(model_provider, "_create_model", lambda provider, model_type: None)
    (moved,) = contract.problems(patch.PATCH)
    assert re.search(r"\b_create_model\b.*\('provider', 'model_type'\)", moved) and "megatron-bridge >=0.6" in moved
    monkeypatch.delattr(model_provider, "_create_model")
    assert "_create_model is gone" in contract.problems(patch.PATCH)[0]


def test_the_recipe_factory_gives_current_scaling_a_dequantized_backward():
    from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling

    made = {"current": Float8CurrentScaling(), "delayed": DelayedScaling()}
    factory = fp8_base.with_dequantized_backward(lambda kind: made[kind])
    assert fp8_base.with_dequantized_backward(factory) is factory
    assert factory("current").backward_override == "dequantized"
    assert made["current"].backward_override is None  # a new recipe, the factory's own left alone
    assert factory("delayed") is made["delayed"]


def test_the_model_is_built_with_gradients_off():
    import torch

    seen = []
    factory = fp8_base.build_without_grad(lambda *a, **k: seen.append(torch.is_grad_enabled()) or "model")
    assert fp8_base.build_without_grad(factory) is factory
    assert factory(1, model_type=2) == "model" and seen == [False] and torch.is_grad_enabled()


# --- the GPU at hand, checked before launch -------------------------------------------------------


def test_fp8_on_an_a100_is_refused_with_the_recipe_that_fits():
    name = "qwen35_27b_peft_1gpu_h100_fp8base_config"
    (problem,) = gpu_fit.problems(registry.find(name), build(name), A100, None, 1)
    assert re.search(r"\bFP8\b.*\bcompute capability 8\.0\b", problem)
    assert problem.endswith("recipes for it: qwen35_27b_peft_1gpu_a100_bf16_config")


def test_a_recipe_larger_than_the_gpu_is_refused_with_the_recipes_that_fit():
    name = "qwen35_35b_a3b_peft_1gpu_h200_bf16_config"
    (problem,) = gpu_fit.problems(registry.find(name), build(name), H100, None, 1)
    assert "written for h200" in problem and f"{H100.name} ({H100.memory_gb:.1f} GB)" in problem
    fitting = problem.split("recipes for it: ")[1].split(", ")
    assert fitting[0] == "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"
    assert "qwen35_35b_a3b_peft_1gpu_a100_bf16_config" in fitting
    (capped,) = gpu_fit.problems(registry.find(name), build(name), H200, 48, 1)
    assert re.search(rf"\b{H200.name} capped at 48\b", capped) and capped.endswith(
        "recipes for it: qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config"
    )


def test_a_recipe_on_its_own_card_or_a_larger_one_passes():
    for name, device in (
        ("qwen35_27b_peft_1gpu_l40s_fp8base_config", L40S),
        ("qwen35_27b_peft_1gpu_a100_bf16_config", A100),
        ("qwen35_27b_peft_1gpu_l40s_fp8base_config", H200),
    ):
        assert gpu_fit.problems(registry.find(name), build(name), device, None, 1) == []


GB300 = Device("NVIDIA GB300", 288 * 2**30 / 1e9, (10, 3))
# a LoRA recipe without base weights, launched as the benchmark launches it
LORA_SWITCHES = ["--lora-from-random-init", *BENCHMARK_OVERRIDES]


def test_mxfp8_before_blackwell_is_refused():
    name = "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config"
    cfg = build(name)
    assert gpu_fit.uses_mxfp8(cfg)
    assert not gpu_fit.uses_mxfp8(build("qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config"))
    problems = gpu_fit.problems(registry.find(name), cfg, H200, None, 8)
    assert re.search(r"\bMXFP8\b.*\bcompute capability 9\.0\b.*\bBlackwell\b", problems[0])
    assert "no recipe of" in problems[-1]  # nothing of this model and task for eight H200s
    assert gpu_fit.problems(registry.find(name), cfg, GB300, None, 8) == []


@pytest.fixture
def launch_on(monkeypatch):
    """A launch on a faked device: the machine's prerequisites met, no re-exec; a launch that gets as far
    as training fails the test."""
    from bridge_recipes.runner import environment, launch, prerequisites

    def on(device):
        monkeypatch.setattr(gpu_memory, "current_device", lambda: device)
        monkeypatch.setattr(prerequisites, "launch_problems", lambda cfg: [])
        monkeypatch.setattr(environment, "reexec_with", lambda env: pytest.fail("re-executed before the GPU check"))
        monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("launched on a GPU it cannot run on"))

    return on


@pytest.mark.parametrize(
    ("name", "device", "argv", "reason", "fits"),
    [
        (
            "qwen35_35b_a3b_peft_1gpu_h200_bf16_config",
            H100,
            LORA_SWITCHES,
            r"written for h200 .* plans \d+\.\d GB per GPU, more than this NVIDIA H100",
            "qwen35_35b_a3b_peft_1gpu_h100_bf16_config",
        ),
        (
            "qwen35_27b_peft_1gpu_h100_fp8base_config",
            A100,
            LORA_SWITCHES,
            r"\bFP8\b.*\bcompute capability 8\.0\b",
            "qwen35_27b_peft_1gpu_a100_bf16_config",
        ),
        (
            "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config",
            H200,
            ["--world-size", "8"],
            r"\bMXFP8\b.*\bcompute capability 9\.0\b",
            None,
        ),
    ],
)
def test_a_launch_on_a_gpu_the_recipe_cannot_run_on_ends_before_it_starts(
    capsys, launch_on, name, device, argv, reason, fits
):
    launch_on(device)
    assert main(["--recipe", name, *argv]) == 2
    err = capsys.readouterr().err
    assert re.search(reason, err) and "Traceback" not in err
    if fits:
        assert re.search(rf"recipes for it: {fits}\b", err)
    else:
        assert "no recipe of" in err and "--list --filter" in err


def test_the_memory_cap_is_checked_against_the_device():
    assert "positive" in gpu_memory.cap_problem(0, H200)
    assert "no CUDA GPU" in gpu_memory.cap_problem(48, None)
    too_much = gpu_memory.cap_problem(80, L40S)
    assert re.search(rf"^--gpu-memory-gb 80\b.*\b{L40S.memory_gb:.1f} GB\b.*{L40S.name}\b.*\bat most\b", too_much)
    # an L40S reports 47.7 GB: the card's name is more than it has
    assert gpu_memory.cap_problem(47.5, L40S) is None and "47.7 GB" in gpu_memory.cap_problem(48, L40S)


def test_plan_at_a_card_memory_names_the_recipes_that_fit(capsys):
    code = main(["--recipe", "qwen35_35b_a3b_peft_1gpu_h200_bf16_config", "--plan", "--gpu-memory-gb", "48"])
    out = capsys.readouterr().out
    assert code == 2 and re.search(r"\bh200\b.*\bcapped\b.*\b48 GB\b", out)
    assert re.search(r"\b48\.0 GB\b.*: qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config$", out, re.M)


# --- the comparison at a card's memory --------------------------------------------------------------


def test_a_recipe_chooses_how_its_fp8_base_multiplies():
    """``fp8_frozen_base(cfg, gemms=...)``: BF16 GEMMs unless a recipe asks for FP8 (the 35B-A3B's 48 GB
    recipe, whose BF16 GEMMs do not fit the card); a value that is neither is refused, naming it."""
    from bridge_recipes.recipes.qwen.policy import fp8_frozen_base

    cfg = build("qwen35_27b_peft_1gpu_a100_bf16_config")
    fp8_frozen_base(cfg)
    assert cfg.features.fp8_base.gemms == "bf16" and not any("BRIDGE_RECIPES" in k for k in cfg.env_vars)
    fp8_frozen_base(cfg, gemms="fp8")
    assert cfg.features.fp8_base.gemms == "fp8"
    with pytest.raises(ValueError, match="gemms='fp16'"):
        fp8_frozen_base(cfg, gemms="fp16")
    gemms = {n: build(n).features.fp8_base.gemms for n in sorted(CLASSES) if CLASSES[n][1]}
    assert {n for n, c in gemms.items() if c == "fp8"} == {"qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config"}


@pytest.mark.parametrize("name", [n for n in sorted(CLASSES) if CLASSES[n][1]])
def test_the_summary_says_how_an_fp8_base_multiplies_as_it_runs(name):
    """The summary reads the GEMMs' precision from the setting the patch installs from."""
    from bridge_recipes.runner import checks

    cfg = build(name)
    (line,) = [x for x in checks.summary(cfg, 1).splitlines() if x.startswith("precision")]
    bf16 = cfg.features.fp8_base.gemms == "bf16"
    assert "FP8 base storage" in line
    assert ("BF16 GEMMs on the dequantized FP8 base" in line) == bf16 and ("FP8 forward GEMMs" in line) == (not bf16)
