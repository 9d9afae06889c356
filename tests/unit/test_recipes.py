"""Every recipe: builds offline, passes the layout checks at its GPU count, matches the
published layout it claims, shares its execution-policy helper between the two trees."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from bridge_recipes.models.qwen35 import SPECS, is_vlm
from bridge_recipes.plan.layout import layout_of, stage_layers
from bridge_recipes.recipes import registry
from bridge_recipes.recipes.recipe import RecipeMeta
from bridge_recipes.runner import checks
from bridge_recipes.runner.problems import megatron_validation

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(registry.discover())
# Names fixed by the reference page of the GB300 module (bridge-gb300-vl) rather than by our convention.
PAGE_NAMES = {"qwen35_vl_397b_a17b_pretrain_config"}


def build(name):
    return registry.load(name)()


# Megatron-Bridge's own 8-GPU MXFP8 benchmark layout (bridge-perf-recipes): the planner's upper
# bound (FP8 activations and weights counted as BF16) puts it over the GB300.
PLANNED_OVER_AS_AN_UPPER_BOUND = {"qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_config"}


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_builds_passes_checks_and_plans_to_fit_at_its_gpu_count(name):
    from bridge_recipes.plan.memory import plan_memory

    entry = registry.find(name)
    cfg = build(name)
    assert checks.errors(checks.check(cfg, entry.meta.gpus)) == []
    assert megatron_validation(cfg, entry.meta.gpus) is None
    plan = plan_memory(cfg, entry.meta.gpus, gpu=entry.meta.gpu)
    if name in PLANNED_OVER_AS_AN_UPPER_BOUND:
        assert not plan.fits and any("upper bound" in n for n in plan.notes)
    else:
        assert plan.fits, (name, [round(s.total_gb, 1) for s in plan.stages])


def _layout_tokens(label):
    return dict((k, int(v)) for k, v in re.findall(r"\b(TP|PP|CP|EP|ETP|DP)(\d+)\b", label))


@pytest.mark.parametrize("name", RECIPES)
def test_layout_label_matches_the_config(name):
    entry = registry.find(name)
    lay = layout_of(build(name), entry.meta.gpus)
    actual = {"TP": lay.tp, "PP": lay.pp, "CP": lay.cp, "EP": lay.ep, "ETP": lay.etp, "DP": lay.dp}
    claimed = _layout_tokens(entry.meta.layout)
    assert claimed and {k: actual[k] for k in claimed} == claimed


NAME = re.compile(
    r"^(?P<model>qwen35_(?:vl_)?\w+?)_(?P<task>pretrain|sft|peft)_(?P<n>\d+)gpu_(?P<gpu>[a-z0-9]+)_"
    r"(?P<prec>bf16|fp8cs|fp8mx|fp8base)(?:_(?P<variant>\w+?))?_config$"
)


@pytest.mark.parametrize("name", [n for n in RECIPES if n not in PAGE_NAMES])
def test_name_follows_the_convention_and_agrees_with_metadata(name):
    m = NAME.match(name)
    assert m, name
    meta = registry.find(name).meta
    assert m["model"] in SPECS
    assert (m["task"], int(m["n"]), m["gpu"], m["prec"]) == (meta.task, meta.gpus, meta.gpu, meta.precision)


# A recipe's docstring says what the policy is and why; measurements live in the result files and evidence it names.
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\blease\b|\bpredicted\b", re.IGNORECASE)


@pytest.mark.parametrize("name", sorted(registry.discover()))
def test_docstring_fits_a_screen_without_dates_or_predictions(name):
    entry = registry.find(name)
    module = ast.parse(entry.path.read_text())
    (fn,) = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name]
    doc = ast.get_docstring(fn) or ""
    assert doc, f"{name} has no docstring"
    assert len(doc.splitlines()) <= 8, f"{name}: {len(doc.splitlines())} docstring lines"
    assert not DATED.search(doc), f"{name}: {DATED.search(doc).group(0)!r} in its docstring"


def test_recipe_metadata_has_no_free_text_notes():
    with pytest.raises(TypeError, match="notes"):
        RecipeMeta(task="sft", gpus=8, gpu="h200", precision="bf16", layout="TP1", notes="x")


@pytest.mark.parametrize("name", [n for n in RECIPES if registry.find(n).tree == "perf_recipes"])
def test_perf_recipes_use_mock_data_and_no_checkpoints(name):
    cfg = build(name)
    if is_vlm(cfg):
        assert type(cfg.dataset).__name__ == "MockVLMSFTDatasetConfig"
        assert cfg.model.moe_router_force_load_balancing
    else:
        assert cfg.dataset.blend is None and cfg.dataset.blend_per_split is None and cfg.dataset.data_path is None
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer"
    assert cfg.checkpoint.save is None and cfg.checkpoint.load is None
    assert cfg.train.train_iters == 20 and cfg.logger.log_interval == 1


# --- one execution policy, used by both trees --------------------------------------------

HELPER = re.compile(r"^_apply_\w+_execution_config$")
# A benchmark-only layout: the real-data GB300 module keeps exactly the helpers of its page.
PERF_ONLY_HELPERS = {"_apply_qwen35_vl_35b_a3b_8gpu_gb300_execution_config"}


def _helpers():
    out = {}
    for entry in registry.discover().values():
        mod = importlib.import_module(entry.module)
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if HELPER.match(name) and fn.__module__ == mod.__name__:
                out[name] = mod
    return out


def test_each_policy_helper_is_defined_once():
    sources = [p.read_text() for tree in ("bridge_recipes", "perf_recipes") for p in (ROOT / tree).rglob("*.py")]
    for name in _helpers():
        assert sum(len(re.findall(rf"^def {name}\(", s, re.M)) for s in sources) == 1, name


def test_recipes_and_helpers_are_typed_with_the_config_they_build_or_change():
    """Recipes return a ConfigContainer and helpers take one (a name only: the annotation is
    never evaluated, so listing recipes imports nothing)."""
    for name in RECIPES:
        assert inspect.signature(registry.load(name)).return_annotation == "ConfigContainer", name
    for name, mod in _helpers().items():
        sig = inspect.signature(getattr(mod, name))
        assert [str(p.annotation) for p in sig.parameters.values()] == ["ConfigContainer"], name
        assert sig.return_annotation == "None", name


def test_policy_helpers_are_used_by_both_trees(monkeypatch):
    helpers = _helpers()
    calls = {}
    for name, mod in helpers.items():
        real = getattr(mod, name)

        def spy(cfg, _name=name, _real=real):
            calls.setdefault(_name, set()).add(current[0])
            return _real(cfg)

        monkeypatch.setattr(mod, name, spy)
    current = [None]
    for recipe_name in RECIPES:
        current[0] = registry.find(recipe_name).tree
        build(recipe_name)
        assert any(current[0] in v for v in calls.values()), f"{recipe_name} applies no execution-policy helper"
    for name, trees in calls.items():
        if name in PERF_ONLY_HELPERS:
            assert trees == {"perf_recipes"}
            continue
        assert helpers[name].__name__.startswith("bridge_recipes."), f"{name} must live in bridge_recipes"
        assert trees == {"bridge_recipes", "perf_recipes"}, (name, trees)
    assert set(calls) == set(helpers)


# --- pinned to the sources of docs/sources.md ------------------------------------------------


def _recompute(cfg):
    m = cfg.model
    return (m.recompute_granularity, m.recompute_method, m.recompute_num_layers)


def test_h200_sft_workload_is_the_openrecipes_one():
    for name in [n for n in RECIPES if "_sft_8gpu_h200_" in n]:
        cfg, o = build(name), build(name).optimizer
        assert cfg.train.global_batch_size == 128, name
        assert (o.lr, o.min_lr, o.weight_decay, o.adam_beta1, o.adam_beta2) == (1e-5, 1e-6, 0.1, 0.9, 0.98)
        assert cfg.scheduler.lr_decay_style == "cosine"
        assert cfg.scheduler.lr_warmup_iters == cfg.train.train_iters // 10 or "mock" in name
        assert o.use_distributed_optimizer and o.use_precision_aware_optimizer
        assert cfg.model.calculate_per_token_loss and cfg.model.attention_backend.name == "flash"
        assert cfg.env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == 1
        assert cfg.env_vars["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        assert cfg.env_vars["TORCHINDUCTOR_COMPILE_THREADS"] == 1


def test_35b_a3b_h200_layouts_openrecipes_35b_h200():
    base = build("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")
    m = base.model
    assert (
        m.tensor_model_parallel_size,
        m.pipeline_model_parallel_size,
        m.expert_model_parallel_size,
        m.expert_tensor_parallel_size,
        m.context_parallel_size,
    ) == (1, 1, 8, 1, 1)
    assert (base.train.micro_batch_size, m.seq_length) == (1, 8192)
    assert _recompute(base) == ("full", "uniform", 1) and m.moe_token_dispatcher_type == "alltoall"
    assert not base.optimizer.optimizer_cpu_offload
    mt16k = build("qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config")
    assert mt16k.train.micro_batch_size * mt16k.model.seq_length == 16384
    o = mt16k.optimizer
    assert o.optimizer_cpu_offload and o.optimizer_offload_fraction == 1.0 and o.overlap_cpu_optimizer_d2h_h2d
    pp2 = build("qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_config")
    assert (pp2.model.pipeline_model_parallel_size, pp2.model.expert_model_parallel_size) == (2, 4)
    assert pp2.optimizer.optimizer_cpu_offload and pp2.train.micro_batch_size == 2
    refs = {
        n: registry.find(n).meta.reference["tokens_per_s_per_gpu"]
        for n in (
            "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
            "qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config",
            "qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_config",
        )
    }
    assert list(refs.values()) == [4663.1, 3466.8, 3076.8]


def test_27b_h200_layouts_openrecipes_27b_h200():
    cfg = build("qwen35_27b_sft_8gpu_h200_bf16_config")
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size) == (1, 4)
    assert stage_layers(cfg) == [16, 17, 17, 14]
    assert _recompute(cfg) == ("full", "block", 12) and not cfg.optimizer.optimizer_cpu_offload
    ref = build("qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config")
    r = ref.model
    assert (r.tensor_model_parallel_size, r.sequence_parallel, r.pipeline_model_parallel_size) == (4, True, 2)
    assert stage_layers(ref) == [34, 30] and _recompute(ref)[0] == "full"
    assert ref.optimizer.optimizer_cpu_offload
    assert registry.find("qwen35_27b_sft_8gpu_h200_bf16_config").meta.reference["tokens_per_s_per_gpu"] == 2499.5
    assert (
        registry.find("qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config").meta.reference["tokens_per_s_per_gpu"]
        == 948.7
    )


def test_h100_layout_slime_35b_h100():
    cfg = build("qwen35_35b_a3b_sft_8gpu_h100_bf16_config")
    m = cfg.model
    assert (
        m.tensor_model_parallel_size,
        m.pipeline_model_parallel_size,
        m.context_parallel_size,
        m.expert_model_parallel_size,
        m.expert_tensor_parallel_size,
        m.sequence_parallel,
    ) == (2, 2, 2, 4, 1, True)
    assert _recompute(cfg) == ("full", "uniform", 1)
    assert cfg.optimizer.optimizer_cpu_offload and cfg.optimizer.overlap_cpu_optimizer_d2h_h2d
    assert cfg.optimizer.use_precision_aware_optimizer and m.attention_backend.name == "flash"
    assert m.seq_length * cfg.train.micro_batch_size // m.context_parallel_size == 8192  # tokens per GPU
    assert (m.moe_token_dispatcher_type, m.moe_flex_dispatcher_backend) == ("flex", "deepep")


def test_long_context_layout_opd_35b_h200():
    entry = registry.find("qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config")
    cfg = build(entry.name)
    m = cfg.model
    assert (
        m.tensor_model_parallel_size,
        m.pipeline_model_parallel_size,
        m.context_parallel_size,
        m.expert_model_parallel_size,
        m.expert_tensor_parallel_size,
    ) == (2, 1, 2, 8, 1)
    assert layout_of(cfg, 8).dp == 2 and cfg.optimizer.optimizer_cpu_offload
    assert entry.meta.status == "unmeasured"
    # 32,768-token sequences, 16,384 per CP rank; Megatron-Core accepts CP2 with Gated DeltaNet
    assert m.seq_length == cfg.dataset.seq_length == 32768
    assert megatron_validation(cfg, 8) is None


def test_b200_is_the_h200_winner_with_half_the_layers_recomputed():
    import dataclasses

    entry = registry.find("qwen35_35b_a3b_sft_8gpu_b200_bf16_config")
    assert entry.meta.status == "unmeasured" and entry.meta.reference["tokens_per_s_per_gpu"] == 6573.4
    b200, h200 = build(entry.name), build("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")
    differ = {
        f.name for f in dataclasses.fields(b200.model) if getattr(b200.model, f.name) != getattr(h200.model, f.name)
    }
    assert differ == {"recompute_method", "recompute_num_layers"}
    assert _recompute(b200) == ("full", "block", 20) and b200.model.num_layers == 40
    assert b200.optimizer == h200.optimizer and b200.train == h200.train and b200.env_vars == h200.env_vars


# --- the GB300 VL module of bridge-gb300-vl --------------------------------------------------

GB300_PUBLIC = {
    "qwen35_vl_397b_a17b_pretrain_config",
    "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config",
    "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config",
}
GB300_PRIVATE = {
    "_apply_qwen35_vl_397b_a17b_64gpu_gb300_execution_config",
    "_apply_qwen35_vl_35b_a3b_16gpu_gb300_execution_config",
}


def test_gb300_module_has_exactly_the_functions_of_its_page():
    mod = importlib.import_module("bridge_recipes.recipes.qwen_vl.gb300.qwen35_vl")
    own = {n for n, f in inspect.getmembers(mod, inspect.isfunction) if f.__module__ == mod.__name__}
    assert own == GB300_PUBLIC | GB300_PRIVATE
    assert set(mod.__all__) == GB300_PUBLIC


def test_gb300_library_recipe_keeps_the_16gpu_policy_and_adds_mxfp8():
    base = build("qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config")
    lib = build("qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config")
    for cfg in (base, lib):
        m = cfg.model
        assert (
            m.expert_model_parallel_size,
            m.tensor_model_parallel_size,
            m.pipeline_model_parallel_size,
            m.context_parallel_size,
        ) == (4, 1, 1, 1)
        assert (cfg.train.micro_batch_size, cfg.train.global_batch_size) == (4, 2048)
        assert m.cuda_graph_impl == "transformer_engine" and m.recompute_granularity == "selective"
        assert m.moe_router_force_load_balancing is False
        assert m.max_vision_cuda_graph_seq_length == 3712
    assert type(lib.mixed_precision).__name__ == "MixedPrecisionConfig" and lib.mixed_precision.fp8_recipe == "mxfp8"
    assert lib.env_vars["NVTE_CUTEDSL_FUSED_GROUPED_MLP"] == 1
    assert (lib.model.moe_token_dispatcher_type, lib.model.moe_flex_dispatcher_backend) == ("flex", "hybridep")
    assert lib.env_vars["NVTE_NORM_FWD_USE_CUDNN"] == 1
    from bridge_recipes.recipes.qwen_vl.policy import gdn_kernel_backend_declared

    assert hasattr(lib.model, "gdn_kernel_backend") == gdn_kernel_backend_declared()
    assert layout_of(lib, 8).dp == 8
    assert lib.train.global_batch_size // (lib.train.micro_batch_size * 8) == 64  # micro batches per rank


def _energon_metadata(folder: Path) -> Path:
    """``folder`` with the metadata of a prepared Energon dataset (train and val splits), and no data."""
    import yaml

    from bridge_recipes.vl.vl_dataset import META_DIR, SAMPLE_LOADER

    meta = folder / META_DIR
    meta.mkdir()
    (meta / "dataset.yaml").write_text(yaml.safe_dump(SAMPLE_LOADER))
    splits = {"split_parts": {"train": ["train-000000.tar"], "val": ["val-000000.tar"]}}
    (meta / "split.yaml").write_text(yaml.safe_dump(splits))
    (meta / "index.sqlite").write_bytes(b"")
    (meta / ".info.json").write_text("{}")
    return folder


def test_gb300_image_budget_above_the_vision_graph_cap_is_refused(tmp_path):
    from bridge_recipes.config import datasets
    from bridge_recipes.config.overrides import apply_all

    cfg = build("qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config")
    datasets.select(cfg, "energon")
    apply_all(cfg, {}, [f"dataset.path={_energon_metadata(tmp_path)}", "dataset.task_encoder.max_pixels=200704"])
    assert checks.errors(checks.check(cfg, 8)) == []
    assert checks.vision_patches_per_micro_batch(cfg) == 4 * 784
    apply_all(cfg, {}, ["dataset.task_encoder.max_pixels=401408"])
    msgs = [str(p) for p in checks.errors(checks.check(cfg, 8))]
    assert any(re.search(r"max_pixels=401408\b.*cap of 3712\b", m) for m in msgs), msgs


def test_gb300_perf_fp8mx_benchmark_is_ep8_gbs512_and_not_the_library_name():
    cfg = build("qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_config")
    assert (cfg.model.expert_model_parallel_size, cfg.train.global_batch_size) == (8, 512)
    assert registry.find("qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_config").tree == "perf_recipes"
    assert registry.find("qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config").tree == "bridge_recipes"


def _source_keys():
    table = (ROOT / "docs" / "sources.md").read_text()
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M))


@pytest.mark.parametrize("name", [n for n in RECIPES if (registry.find(n).meta.reference or {}).get("source")])
def test_reference_source_names_a_key_of_docs_sources(name):
    source = registry.find(name).meta.reference["source"]
    match = re.search(r"\(([a-z0-9-]+), docs/sources\.md\)$", source)
    assert match, f"{name}: source {source!r} does not end with '(<key>, docs/sources.md)'"
    assert match.group(1) in _source_keys(), f"{name}: {match.group(1)!r} is not a key of docs/sources.md"


def test_recipe_environment_is_assigned_whole_in_one_place():
    """Recipes and policy blocks never patch ``env_vars`` (item assignment, update, setdefault, a dict
    built on the one there): each function that sets it assigns a whole dict once, so a recipe's
    environment reads in one statement."""
    import ast

    trees = [ROOT / "perf_recipes", ROOT / "bridge_recipes/recipes/qwen", ROOT / "bridge_recipes/recipes/qwen_vl"]
    problems = []
    for path in sorted(p for tree in trees for p in tree.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            whole = 0
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and node.attr == "env_vars":
                    continue
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.targets[0], ast.Attribute)
                    and node.targets[0].attr == "env_vars"
                ):
                    whole += 1
                    read = [n for n in ast.walk(node.value) if isinstance(n, ast.Attribute) and n.attr == "env_vars"]
                    if read:  # built on top of what an earlier block wrote: two places to read
                        problems.append(
                            f"{path.name}:{node.lineno} {fn.name} adds to env_vars instead of assigning it"
                        )
                elif isinstance(node, ast.Subscript) and getattr(node.value, "attr", None) == "env_vars":
                    if isinstance(node.ctx, ast.Store):
                        problems.append(f"{path.name}:{node.lineno} {fn.name} sets one env_vars item")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if getattr(node.func.value, "attr", None) == "env_vars":
                        problems.append(f"{path.name}:{node.lineno} {fn.name} calls env_vars.{node.func.attr}")
            if whole > 1:
                problems.append(f"{path.name}:{fn.lineno} {fn.name} assigns env_vars {whole} times")
    assert problems == []


def test_each_gpus_recipes_stand_on_the_shared_policy_not_on_another_gpus_recipes():
    """A recipe module of one GPU imports the policy blocks and its own GPU's recipes (text or VL), never
    another GPU's: an edit of an H200 recipe changes no recipe of another GPU."""
    import ast

    out = []
    for tree in ("bridge_recipes/recipes", "perf_recipes"):
        for path in sorted((ROOT / tree).glob("qwen*/*/*.py")):
            gpu = path.parent.name
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                for name in names:
                    parts = name.removeprefix("bridge_recipes.recipes.").split(".")
                    if (
                        name.startswith("bridge_recipes.recipes.")
                        and len(parts) > 1
                        and parts[0] in ("qwen", "qwen_vl")
                    ):
                        if parts[1] not in ("policy", gpu):
                            out.append(f"{path.relative_to(ROOT)} imports {name}")
    assert out == []


# --- benchmarks keep their real-data recipe's numerics -----------------------------------------

PERF = [n for n in RECIPES if registry.find(n).tree == "perf_recipes"]


def _counterpart(name):
    return registry.find(name).meta.twin_of


def _numerics(cfg):
    import dataclasses

    values = {f.name: getattr(cfg.model, f.name) for f in dataclasses.fields(cfg.model)}
    values["mixed_precision"] = cfg.mixed_precision
    return values


@pytest.mark.parametrize("name", PERF)
def test_benchmark_differs_from_its_real_recipe_only_where_declared(name):
    from perf_recipes._common import LAYOUT_FIELDS, VL_BENCHMARK_MODEL_SETTINGS

    real_name = _counterpart(name)
    assert registry.find(real_name).tree == "bridge_recipes", real_name
    perf, real = build(name), build(real_name)
    a, b = _numerics(perf), _numerics(real)
    differ = {k for k in a if a[k] != b[k]}
    declared = set(VL_BENCHMARK_MODEL_SETTINGS) if is_vlm(perf) else set()
    if name in getattr(importlib.import_module(registry.find(name).module), "OWN_LAYOUT", []):
        declared |= set(LAYOUT_FIELDS)
    assert differ - declared == set(), f"{name} vs {real_name}: undeclared differences"
    # every declared numerics difference is applied, with the declared value
    for field, value in (VL_BENCHMARK_MODEL_SETTINGS if is_vlm(perf) else {}).items():
        assert a[field] == value, field


# --- the family's multi-node, LoRA and VL recipes ------------------------------------------------


def test_multi_node_sft_layouts_are_the_planned_ones():
    big = build("qwen35_122b_a10b_sft_24gpu_h200_bf16_config")
    assert stage_layers(big) == [17, 18, 13] and big.model.expert_model_parallel_size == 8
    huge = build("qwen35_397b_a17b_sft_64gpu_h200_bf16_config")
    m = huge.model
    assert stage_layers(huge) == [15, 16, 16, 13]
    assert (m.tensor_model_parallel_size, m.sequence_parallel, m.expert_model_parallel_size) == (2, True, 16)
    for cfg in (big, huge):
        assert cfg.train.global_batch_size == 128 and cfg.model.seq_length == 8192
        assert _recompute(cfg) == ("full", "uniform", 1) and not cfg.optimizer.optimizer_cpu_offload


def test_lora_recipes_train_adapters_on_attention_gdn_and_mlp_projections():
    from bridge_recipes.recipes.base import LORA_TARGETS

    assert set(LORA_TARGETS) == {"linear_qkv", "linear_proj", "in_proj", "out_proj", "linear_fc1", "linear_fc2"}
    peft = [n for n in RECIPES if registry.find(n).meta.task == "peft"]
    assert {registry.find(n).model for n in peft} == {
        "qwen35_27b",
        "qwen35_35b_a3b",
        "qwen35_122b_a10b",
        "qwen35_397b_a17b",
    }
    for name in peft:
        cfg = build(name)
        assert type(cfg.peft).__name__ == "LoRA" and sorted(cfg.peft.target_modules) == sorted(LORA_TARGETS), name
        assert (cfg.peft.dim, cfg.optimizer.lr) == (32, 1e-4), name


def test_vl_sft_recipes_train_every_part_and_take_energon_data(tmp_path):
    from bridge_recipes.config import datasets

    for name in ("qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config", "qwen35_vl_397b_a17b_sft_64gpu_h200_bf16_config"):
        cfg = build(name)
        assert is_vlm(cfg) and not (cfg.model.freeze_vision_model or cfg.model.freeze_language_model)
        assert not cfg.ddp.overlap_grad_reduce and cfg.train.global_batch_size == 128
    cfg = build("qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config")
    datasets.select(cfg, "energon")
    msgs = [str(p) for p in checks.errors(checks.check(cfg, 8))]
    assert any("--dataset energon" in m and "dataset.path=" in m for m in msgs), msgs
    cfg.dataset.path = str(_energon_metadata(tmp_path))
    cfg.dataset.task_encoder.max_pixels = 200704
    assert checks.errors(checks.check(cfg, 8)) == []
    assert checks.vision_patches_per_micro_batch(cfg) == 784  # one image of 448 x 448 per micro batch


def test_vl_image_budget_must_leave_room_in_the_sequence(tmp_path):
    """784 patches of 16 x 16 are 196 tokens after the 2 x 2 merge; an image of 8,192 x 8,192
    pixels (65,536 tokens) cannot fit an 8,192-token sample."""
    from bridge_recipes.config import datasets

    cfg = build("qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config")
    datasets.select(cfg, "energon")
    cfg.dataset.path = str(tmp_path)
    cfg.dataset.task_encoder.max_pixels = 8192 * 8192
    msgs = [str(p) for p in checks.errors(checks.check(cfg, 8))]
    image = r"max_pixels=67108864\b.*\b65536 tokens\b.*8192-token sequence.*-sl\b"
    assert any(re.search(image, m) for m in msgs), msgs


def test_the_fast_one_gpu_35b_lora_recipe_runs_its_experts_as_one_cutlass_grouped_gemm():
    """The fast recipe opts in through its environment, the shared one with the switch, without changing
    the shared one; the base recipe keeps Transformer Engine's default (a cuBLAS GEMM an expert)."""
    from bridge_recipes.recipes.qwen.policy import (
        CUTLASS_GROUPED_GEMM_ENV,
        OPENRECIPES_ENV,
        OPENRECIPES_GROUPED_GEMM_ENV,
    )

    shared = dict(OPENRECIPES_ENV)
    fast = build("qwen35_35b_a3b_peft_1gpu_h200_bf16_config").env_vars
    base = build("qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config").env_vars
    assert fast == {**base, CUTLASS_GROUPED_GEMM_ENV: 1} == OPENRECIPES_GROUPED_GEMM_ENV
    assert CUTLASS_GROUPED_GEMM_ENV not in base and OPENRECIPES_ENV == shared


# What a recipe's env_vars may hold: the environment the process's libraries read (CUDA, NCCL, Transformer
# Engine, PyTorch and its compiler, DeepEP's HybridEP topology).
PROCESS_ENV = re.compile(r"^(CUDA_|NCCL_|NVTE_|PYTORCH_|TORCH_|TORCHINDUCTOR_|NUM_OF_|NVLINK_|USE_MNNVL$)")


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipes_env_vars_are_the_process_environment_only(name):
    env = build(name).env_vars
    assert [k for k in env if not PROCESS_ENV.match(k)] == [], "a run's own settings live in its config"


def test_te_cross_entropy_rebuilds_its_gradient_in_fp32():
    """The premise of ``policy.te_cross_entropy``, which the fast recipes use in spite of Megatron-Core's
    stability warning: the installed Transformer Engine keeps FP32 softmax statistics from the forward
    and rebuilds the derivative from them in FP32, not a BF16 gradient made in the forward."""
    import torch  # noqa: F401  (loads the libraries Transformer Engine links against)
    from transformer_engine.pytorch.triton import cross_entropy as te_ce

    assert "stats" in inspect.signature(te_ce.cross_entropy_backward).parameters
    assert "FP32" in inspect.getdoc(te_ce.cross_entropy_backward)
    assert "stats = torch.empty((n_rows, 2), dtype=torch.float32" in inspect.getsource(te_ce.cross_entropy_forward)
