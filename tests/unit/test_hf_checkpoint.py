"""Hugging Face checkpoints on CPU: the config check against the catalog, the converter's command
line and its errors, the atomic output folder, the import cache, and the runner's flags at
dry-run. Toy folders are saved by transformers' own classes (random init, tiny sizes that keep
the family fields of the recipe's model). The conversions themselves need a GPU
(lab/tests/gpu/test_hf_checkpoint.py); here a stand-in converter exercises the folder handling."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
from pathlib import Path

import pytest

import bridge_recipes
from bridge_recipes.hf import adapters, architecture, exporter, importer
from bridge_recipes.hf import checkpoint as ck
from bridge_recipes.hf.cli import main as convert_main
from bridge_recipes.hf.files import INDEX_FILE, SINGLE_FILE, HfCheckpointError
from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES, make_toy
from bridge_recipes.models.qwen35 import QWEN35_35B_A3B, hf_text_config

MOE_RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
DENSE_RECIPE = "qwen35_27b_sft_8gpu_h200_bf16_config"
# CPU-sized toys: the family fields (head dims, GDN dims, interval) stay the catalog's.
TINY = dict(**CPU_SIZES, max_shard_size="300KB")
TINY_MOE = CPU_MOE_SIZES


@pytest.fixture(scope="module")
def toys(tmp_path_factory):
    root = tmp_path_factory.mktemp("toys")
    make_toy(root / "moe", "moe", **TINY, **TINY_MOE)
    make_toy(root / "dense", "dense", ffn_hidden_size=128, **TINY)
    return root


@pytest.fixture
def moe(toys, tmp_path):
    """A private copy of the MoE toy (tests edit it)."""
    return Path(shutil.copytree(toys / "moe", tmp_path / "moe"))


@pytest.fixture
def full_size(toys, tmp_path):
    """A folder with the full 35B-A3B config (from the catalog), its weights as one shard whose header
    holds every tensor that config declares (the data a sparse file of zeros), and the toy tokenizer."""
    folder = tmp_path / "full"
    folder.mkdir()
    config = hf_text_config(QWEN35_35B_A3B).to_dict()
    config["architectures"] = ["Qwen3_5MoeForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    weights_of_config(folder)
    for f in ck.TOKENIZER_FILES:
        shutil.copy(toys / "moe" / f, folder / f)
    return folder


def weights_of_config(folder: Path) -> None:
    """Replace the folder's weights by one shard holding every tensor its config.json declares, in the
    shape it declares (zeros, written as a sparse file): a folder whose config and weights agree."""
    from bridge_recipes.hf.declared import declared

    config = json.loads((folder / "config.json").read_text())
    moe, vl = ck.MODEL_TYPES[config["model_type"]]
    for f in [*folder.glob("*.safetensors"), folder / INDEX_FILE]:
        f.unlink(missing_ok=True)
    header, end = {}, 0
    for name, tensor in declared(config, vl, moe, set()).items():
        shape = [v for v, _ in tensor.shape]
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [end, end + 2 * math.prod(shape)]}
        end += 2 * math.prod(shape)
    raw = json.dumps(header).encode()
    with open(folder / SINGLE_FILE, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + end)


def edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def edit_model(folder: Path, **changes) -> None:
    """Change config.json's fields and the weights with them: another model, whole."""
    edit_config(folder, **changes)
    weights_of_config(folder)


def mismatch(field: str, checkpoint, recipe) -> re.Pattern:
    """A config-check line: the field, then the checkpoint's value, then the recipe model's."""
    return re.compile(rf"\b{field}\b\W.*\b{checkpoint}\b.*\b{recipe}\b")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = convert_main([str(a) for a in argv] + ["--no-progress"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# ----------------------------------------------------------------- config check


def test_full_size_config_matches_the_catalog_exactly(full_size):
    assert architecture.check_folder_for_recipe(ck.inspect_folder(full_size), MOE_RECIPE) == []


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("hidden_size", 4096, 2048),
        ("num_hidden_layers", 48, 40),
        ("num_attention_heads", 32, 16),
        ("num_key_value_heads", 4, 2),
        ("num_experts", 512, 256),
        ("num_experts_per_tok", 10, 8),
        ("vocab_size", 151936, 248320),
        ("mtp_num_hidden_layers", 0, 1),
        ("head_dim", 128, 256),
    ],
)
def test_each_mismatch_names_field_and_both_values(full_size, capsys, tmp_path, field, value, expected):
    changes = {field: value}
    if field == "num_hidden_layers":  # transformers refuses a layer_types list of another length
        changes["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(value)]
    edit_model(full_size, **changes)
    rc, _, err = run_cli(capsys, "import", "--hf", full_size, "--recipe", MOE_RECIPE, "--out", tmp_path / "o")
    assert rc == 2 and mismatch(field, value, expected).search(err) and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_layer_pattern_mismatch_is_reported(full_size):
    cfg = json.loads((full_size / "config.json").read_text())
    types = cfg["layer_types"]
    types[1] = "full_attention"  # attention at layer 1 as well: not every 4th layer
    edit_model(full_size, layer_types=types)
    problems = architecture.check_folder_for_recipe(ck.inspect_folder(full_size), MOE_RECIPE)
    assert any(re.match(r"full_attention_interval\b.*\bNone\b.*\b4$", p) for p in problems)
    assert any(re.match(r"layer_types\b.*\b40 layers\b.*\[1, 3, 7,", p) for p in problems)


def test_toy_fails_exact_check_but_passes_scaled(toys):
    folder = ck.inspect_folder(toys / "moe")
    exact = architecture.check_folder_for_recipe(folder, MOE_RECIPE)
    assert any(mismatch("hidden_size", 64, 2048).match(p) for p in exact)
    assert architecture.check_folder_for_recipe(folder, MOE_RECIPE, scaled=True) == []


def test_scaled_still_checks_family_fields(moe, toys):
    edit_model(moe, head_dim=128)
    (problem,) = architecture.check_folder_for_recipe(ck.inspect_folder(moe), MOE_RECIPE, scaled=True)
    assert mismatch("head_dim", 128, 256).match(problem)
    dense = ck.inspect_folder(toys / "dense")
    (problem,) = architecture.check_folder_for_recipe(dense, MOE_RECIPE, scaled=True)
    assert re.match(r"architecture\b.*'dense text \(Qwen3_5ForCausalLM\)'.*'MoE text", problem)


def test_recipe_model_is_found_by_name_prefix():
    assert architecture.spec_for_recipe(MOE_RECIPE).name == "qwen35_35b_a3b"
    assert (
        architecture.spec_for_recipe("qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config").name == "qwen35_vl_35b_a3b"
    )
    with pytest.raises(HfCheckpointError, match=r"'llama3_8b_sft'.*--list"):
        architecture.spec_for_recipe("llama3_8b_sft")


# ----------------------------------------------------------------- input errors


def test_missing_config(moe, capsys, tmp_path):
    (moe / "config.json").unlink()
    rc, _, err = run_cli(capsys, "import", "--hf", moe, "--recipe", MOE_RECIPE, "--out", tmp_path / "o", "--scaled")
    assert rc == 2 and "config.json is missing" in err and "Traceback" not in err


def test_unknown_model_type(moe, capsys, tmp_path):
    edit_config(moe, model_type="llama")
    rc, _, err = run_cli(capsys, "import", "--hf", moe, "--recipe", MOE_RECIPE, "--out", tmp_path / "o", "--scaled")
    assert rc == 2 and re.search(r"model_type 'llama'.*\bqwen3_5_moe\b", err)


def test_truncated_shard(moe, capsys, tmp_path):
    shard = sorted(moe.glob("*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    rc, _, err = run_cli(capsys, "import", "--hf", moe, "--recipe", MOE_RECIPE, "--out", tmp_path / "o", "--scaled")
    assert rc == 2 and re.search(rf"shard {re.escape(shard.name)}\b.*\b{len(data) - 100} bytes\b.*\bdownload\b", err)
    assert not (tmp_path / "o").exists()


def test_missing_shard(moe, capsys, tmp_path):
    shard = sorted(moe.glob("*.safetensors"))[-1]
    shard.unlink()
    rc, _, err = run_cli(capsys, "import", "--hf", moe, "--recipe", MOE_RECIPE, "--out", tmp_path / "o", "--scaled")
    assert rc == 2 and re.search(rf"shard {re.escape(shard.name)}\b.*\bindex\.json\b.*\bmissing\b", err)


def test_missing_tokenizer(moe, capsys, tmp_path):
    (moe / "tokenizer.json").unlink()
    rc, _, err = run_cli(capsys, "import", "--hf", moe, "--recipe", MOE_RECIPE, "--out", tmp_path / "o", "--scaled")
    assert rc == 2 and re.search(r"\btokenizer\.json\b.*\bsave_pretrained\b", err)


def test_wrong_architecture(toys, capsys, tmp_path):
    rc, _, err = run_cli(
        capsys, "import", "--hf", toys / "dense", "--recipe", MOE_RECIPE, "--out", tmp_path / "o", "--scaled"
    )
    assert rc == 2 and re.search(r"architecture\b.*'dense text\b.*'MoE text\b", err)


def test_hub_id_not_in_local_cache(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    rc, _, err = run_cli(
        capsys, "import", "--hf", "Qwen/Qwen3.5-27B", "--recipe", DENSE_RECIPE, "--out", tmp_path / "o"
    )
    assert rc == 2 and "Qwen/Qwen3.5-27B" in err and "huggingface-cli download" in err


def test_existing_out_refused_without_overwrite(toys, capsys, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    rc, _, err = run_cli(capsys, "import", "--hf", toys / "moe", "--recipe", MOE_RECIPE, "--out", out, "--scaled")
    assert rc == 2 and re.search(rf"--out {re.escape(str(out))}\b.*--overwrite\b", err)
    assert (out / "keep.txt").read_text() == "user data"


def test_read_only_out_refused(toys, capsys, tmp_path, monkeypatch):
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real(p, mode))
    rc, _, err = run_cli(
        capsys, "import", "--hf", toys / "moe", "--recipe", MOE_RECIPE, "--out", tmp_path / "o", "--scaled"
    )
    assert rc == 2 and f"under {tmp_path}" in err and "read-only" in err


def test_without_gpu_the_checked_import_stops_cleanly(toys, capsys, tmp_path):
    rc, _, err = run_cli(
        capsys, "import", "--hf", toys / "moe", "--recipe", MOE_RECIPE, "--out", tmp_path / "a" / "o", "--scaled"
    )
    assert rc == 2 and "CUDA GPU" in err and "GPU machine" in err
    assert list(tmp_path.iterdir()) == []  # no partial folder, no parent made for it


def test_export_needs_a_megatron_checkpoint(toys, capsys, tmp_path):
    rc, _, err = run_cli(
        capsys, "export", "--megatron", toys / "moe", "--hf-template", toys / "moe", "--recipe", MOE_RECIPE,
        "--out", tmp_path / "o", "--scaled",
    )  # fmt: skip
    assert rc == 2 and re.search(
        rf"--megatron {re.escape(str(toys / 'moe'))}\b.*\blatest_checkpointed_iteration\b", err
    )


# ----------------------------------------------------------------- atomic output


def fake_convert(src: Path, out: Path) -> None:
    (out / "iter_0000000").mkdir()
    (out / "latest_checkpointed_iteration.txt").write_text("0")


def failing_convert(src: Path, out: Path) -> None:
    (out / "iter_0000000").mkdir()
    raise RuntimeError("conversion broke halfway")


def test_output_appears_only_when_complete(toys, tmp_path):
    out = tmp_path / "o"
    importer.import_checkpoint(toys / "moe", out, recipe=MOE_RECIPE, scaled=True, convert=fake_convert, progress=False)
    assert (out / "latest_checkpointed_iteration.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_failed_conversion_leaves_nothing(toys, tmp_path):
    with pytest.raises(RuntimeError):
        importer.import_checkpoint(toys / "moe", tmp_path / "o", convert=failing_convert, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_overwrite_keeps_old_until_new_is_complete(toys, tmp_path):
    out = tmp_path / "o"
    importer.import_checkpoint(toys / "moe", out, convert=fake_convert, progress=False)
    (out / "old.txt").write_text("old")  # inside a folder the conversion wrote: it goes with the folder
    with pytest.raises(RuntimeError):
        importer.import_checkpoint(toys / "moe", out, overwrite=True, convert=failing_convert, progress=False)
    assert (out / "old.txt").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    importer.import_checkpoint(toys / "moe", out, overwrite=True, convert=fake_convert, progress=False)
    assert not (out / "old.txt").exists() and (out / "latest_checkpointed_iteration.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


# ----------------------------------------------------------------- cache


def test_cache_key_follows_content(moe, tmp_path):
    key = importer.cache_key(ck.inspect_folder(moe))
    copy = Path(shutil.copytree(moe, tmp_path / "copy"))  # same bytes and mtimes elsewhere: same key
    assert importer.cache_key(ck.inspect_folder(copy)) == key
    shard = sorted(copy.glob("*.safetensors"))[0]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a re-written shard
    assert importer.cache_key(ck.inspect_folder(copy)) != key
    edit_config(moe, rms_norm_eps=1e-5)
    assert importer.cache_key(ck.inspect_folder(moe)) != key


def test_cached_import_converts_once(moe, tmp_path, monkeypatch):
    monkeypatch.setenv(importer.CACHE_ENV, str(tmp_path / "cache"))
    calls = []

    def counting(src, out):
        calls.append(src)
        fake_convert(src, out)

    folder = ck.inspect_folder(moe)
    first, converted = importer.cached_import(folder, convert=counting, progress=False)
    again, converted_again = importer.cached_import(folder, convert=counting, progress=False)
    assert first == again == tmp_path / "cache" / "hf_import" / importer.cache_key(folder)
    assert (converted, converted_again, len(calls)) == (True, False, 1)


# ----------------------------------------------------------------- runner flags


def runner(argv):
    from bridge_recipes.runner.cli import main

    return main(argv)


def test_runner_dry_run_takes_the_shape_from_the_checkpoint_and_uses_its_tokenizer(
    toys, capsys, tmp_path, monkeypatch
):
    """A toy checkpoint needs --scale-down (its layer count) and nothing else: hidden size, heads,
    experts, vocabulary and MTP depth come from its config.json; the recipe's policy stays."""
    monkeypatch.setenv(importer.CACHE_ENV, str(tmp_path / "cache"))
    from bridge_recipes.runner.arguments import build_parser
    from bridge_recipes.runner.cli import build

    argv = ["--recipe", MOE_RECIPE, "--dry-run", "--scale-down", "4", "--hf-checkpoint", str(toys / "moe")]
    _, cfg = build(build_parser().parse_intermixed_args(argv))
    m = cfg.model
    shape = (
        m.hidden_size,
        m.num_attention_heads,
        m.num_moe_experts,
        m.moe_router_topk,
        m.vocab_size,
        m.mtp_num_layers,
    )
    assert shape == (TINY["hidden_size"], TINY["num_attention_heads"], 4, 2, TINY["vocab_size"], 0)
    recipe = bridge_recipes.build(MOE_RECIPE, scale_down=4, scale_experts=4)
    assert (m.recompute_granularity, m.moe_token_dispatcher_type, m.seq_length) == (
        recipe.model.recompute_granularity,
        recipe.model.moe_token_dispatcher_type,
        recipe.model.seq_length,
    )
    assert re.search(r"hf checkpoint\b.*\bmodel\.hidden_size\b.*\b2048 -> 64\b", capsys.readouterr().out)
    rc = runner(argv)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert cfg.tokenizer.tokenizer_type == "HuggingFaceTokenizer" and cfg.tokenizer.tokenizer_model == str(
        toys / "moe"
    )
    key = importer.cache_key(ck.inspect_folder(toys / "moe"))
    cached = tmp_path / "cache" / "hf_import" / key
    assert re.search(rf"^weights\s+{re.escape(str(toys / 'moe'))}\b.* {re.escape(str(cached))}\b", cap.out, re.M)
    assert "random initialization" not in cap.err
    assert not (tmp_path / "cache").exists()  # dry-run converts nothing


def test_runner_refuses_a_checkpoint_of_another_family_naming_the_field(toys, capsys):
    rc = runner(["--recipe", DENSE_RECIPE, "--dry-run", "--scale-down", "4", "--hf-checkpoint", str(toys / "moe")])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(r"architecture\b.*'MoE text\b.*'dense text\b", err)


def test_runner_refuses_a_scale_down_or_override_that_the_weights_do_not_fit(toys, capsys):
    base = ["--recipe", MOE_RECIPE, "--dry-run", "--hf-checkpoint", str(toys / "moe")]
    assert runner([*base, "--scale-down", "8"]) == 2
    assert "--scale-down 4" in capsys.readouterr().err  # the checkpoint's layer count
    assert runner([*base, "--scale-down", "4", "--scale-experts", "2"]) == 2
    assert "--scale-experts" in capsys.readouterr().err
    assert runner([*base, "--scale-down", "4", "model.hidden_size=128"]) == 2
    err = capsys.readouterr().err
    assert mismatch("hidden_size", 64, 128).search(err) and "model.hidden_size" in err


def test_runner_without_scale_down_says_how_to_fit_a_small_checkpoint(toys, capsys):
    assert runner(["--recipe", MOE_RECIPE, "--dry-run", "--hf-checkpoint", str(toys / "moe")]) == 2
    assert "--scale-down 4" in capsys.readouterr().err


def test_runner_refuses_fp8_parameters_for_a_fine_tune_from_hf_weights(toys, capsys, tmp_path, monkeypatch):
    """The launch attaches the converted weights after the layout checks, so --hf-checkpoint is checked for
    FP8 parameters when it is read; BF16 parameters with FP8 GEMMs pass."""
    monkeypatch.setenv(importer.CACHE_ENV, str(tmp_path / "cache"))
    argv = ["--recipe", MOE_RECIPE, "--dry-run", "--scale-down", "4"]
    argv += [
        "--hf-checkpoint",
        str(toys / "moe"),
        "mixed_precision=bf16_with_fp8_current_scaling_mixed",
    ]
    assert runner(argv) == 2
    err = capsys.readouterr().err
    assert f"--hf-checkpoint {toys / 'moe'}" in err and "mixed_precision.fp8_param_gather=false" in err
    assert runner([*argv, "mixed_precision.fp8_param_gather=false"]) == 0
    assert not (tmp_path / "cache").exists()


def test_runner_warns_of_random_init_for_sft_without_weights(capsys):
    assert runner(["--recipe", MOE_RECIPE, "--dry-run", "--scale-down", "4"]) == 0
    err = capsys.readouterr().err
    assert "random initialization" in err and "--hf-checkpoint DIR" in err


def test_runner_export_flag_needs_hf_checkpoint(capsys, tmp_path):
    rc = runner(["--recipe", MOE_RECIPE, "--dry-run", "--scale-down", "4", "--export-hf", str(tmp_path / "x")])
    assert rc == 2 and "--export-hf needs --hf-checkpoint" in capsys.readouterr().err


def test_conversion_children_leave_torchrun_rendezvous_behind(monkeypatch):
    from bridge_recipes.hf.run_hooks import child_env

    for k, v in {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_PORT": "29500", "RANK": "0", "KEEP_ME": "1"}.items():
        monkeypatch.setenv(k, v)
    env = child_env()
    assert "TORCHELASTIC_USE_AGENT_STORE" not in env and "MASTER_PORT" not in env and "RANK" not in env
    assert env["KEEP_ME"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_a_vl_folder_without_a_vision_tower_is_refused(moe):
    """A VL config without its vision_config is refused before any recipe takes it (transformers
    would build its default tower)."""
    cfg = json.loads((moe / "config.json").read_text())
    (moe / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": cfg}))
    with pytest.raises(HfCheckpointError, match=r"vision_config is missing.*'qwen3_5_moe'"):
        ck.inspect_folder(moe)


def test_hub_id_in_local_cache_resolves_offline(toys, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = cache / "models--Qwen--Toy"
    snapshot = repo / "snapshots" / ("a" * 40)
    shutil.copytree(toys / "moe", snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    assert ck.resolve_source("Qwen/Toy") == snapshot
    assert architecture.check_folder_for_recipe(ck.inspect_folder("Qwen/Toy"), MOE_RECIPE, scaled=True) == []


def test_runner_refuses_two_sources_of_weights(toys, capsys, tmp_path):
    rc = runner(
        ["--recipe", MOE_RECIPE, "--dry-run", "--scale-down", "4", "--hf-checkpoint", str(toys / "moe")]
        + ["--pretrained-checkpoint", str(tmp_path)]
    )
    assert rc == 2 and "pass one" in capsys.readouterr().err


# ----------------------------------------------------------------- LoRA export


def saved_run(folder: Path, peft: dict | None) -> Path:
    """A checkpoint folder as Megatron-Bridge saves it: the tracker and the newest run config."""
    import yaml

    it = folder / "iter_0000010"
    it.mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("10")
    doc = {"model": {"num_layers": 4}, "checkpoint": {}, "optimizer": {}, "peft": peft}
    (it / "run_config.yaml").write_text(yaml.safe_dump(doc))
    return folder


LORA = {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": 8, "alpha": 16, "target_modules": ["linear_qkv"]}


def test_lora_settings_tell_adapter_runs_from_full_ones(tmp_path):
    assert adapters.lora_settings(saved_run(tmp_path / "lora", LORA))["dim"] == 8
    assert adapters.lora_settings(saved_run(tmp_path / "full", None)) is None
    assert adapters.lora_settings(tmp_path) is None  # nothing saved yet


def test_lora_checkpoint_export_merges_into_the_template(toys, tmp_path):
    calls = []

    def record(kind):
        def convert(megatron, template, out, *adapter_out):
            calls.append((kind, megatron.name, template))
            (out / "model.safetensors").write_bytes(b"x")

        return convert

    kw = dict(recipe=MOE_RECIPE, scaled=True, progress=False, convert=record("full"), lora_convert=record("lora"))
    exporter.export_checkpoint(saved_run(tmp_path / "lora", LORA), toys / "moe", tmp_path / "o1", **kw)
    exporter.export_checkpoint(saved_run(tmp_path / "full", None), toys / "moe", tmp_path / "o2", **kw)
    assert [c[:2] for c in calls] == [("lora", "lora"), ("full", "full")]


def test_lora_from_settings_keeps_the_saved_fields():
    pytest.importorskip("megatron.bridge")
    lora = adapters.lora_from_settings({**LORA, "unknown_field": 1, "dropout": None})
    assert (lora.dim, lora.alpha, list(lora.target_modules)) == (8, 16, ["linear_qkv"])


class _Float16ModuleLike:
    """What Megatron-Core's Float16Module does with a state dict: hands it on, returns nothing."""

    def __init__(self, module):
        self.module = module

    def load_state_dict(self, state_dict, strict=True):
        self.module.load_state_dict(state_dict, strict=strict)


def _adapter_model():
    import torch

    model = torch.nn.Module()
    model.base = torch.nn.Linear(2, 2)
    model.adapter = torch.nn.Linear(2, 1, bias=False)
    return model


def test_load_adapters_loads_through_a_wrapper_and_keeps_the_base():
    import torch

    model = _adapter_model()
    base = model.base.weight.detach().clone()
    adapters.load_adapters(_Float16ModuleLike(model), {"adapter.weight": torch.full((1, 2), 3.0)})
    assert torch.equal(model.adapter.weight, torch.full((1, 2), 3.0)) and torch.equal(model.base.weight, base)


def test_load_adapters_refuses_weights_with_no_place_in_the_model():
    import torch

    with pytest.raises(HfCheckpointError, match="no place in the model: \\['decoder.lora.weight'\\]"):
        adapters.load_adapters(_Float16ModuleLike(_adapter_model()), {"decoder.lora.weight": torch.zeros(1)})


def test_identical_names_compares_across_dtypes(tmp_path):
    import torch
    from safetensors.torch import save_file

    from bridge_recipes.hf.parity import identical_names

    base = {"a": torch.randn(4, dtype=torch.float32).bfloat16(), "b": torch.ones(2, dtype=torch.bfloat16)}
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    save_file(base, str(tmp_path / "x" / "model.safetensors"))
    save_file({"a": base["a"].float(), "b": base["b"].float() * 2}, str(tmp_path / "y" / "model.safetensors"))
    assert identical_names(tmp_path / "x", tmp_path / "y") == (["a"], ["b"])


def test_lora_settings_read_back_from_a_peft_recipes_saved_config(tmp_path):
    """The run config of a LoRA recipe, written as Megatron-Bridge's YAML, gives back its LoRA."""
    import bridge_recipes
    from bridge_recipes.config.files import to_text
    from bridge_recipes.recipes.base import LORA_TARGETS

    cfg = bridge_recipes.build("qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config", scale_down=4, scale_experts=16)
    it = tmp_path / "iter_0000010"
    it.mkdir()
    (it / "run_config.yaml").write_text(to_text(cfg, "qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config"))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("10")
    lora = adapters.lora_from_settings(adapters.lora_settings(tmp_path))
    assert (lora.dim, lora.alpha, list(lora.target_modules)) == (cfg.peft.dim, cfg.peft.alpha, list(LORA_TARGETS))


def test_toy_with_the_fixture_tokenizer_builds_rows_with_its_own_template(tmp_path):
    """The offline road from a toy folder: its tokenizer and chat template render reasoning and
    tool-call conversations into rows, nothing skipped, and the dry run of the SFT recipe accepts
    the toy as --hf-checkpoint (its shape taken from it) with those rows."""
    import contextlib
    import io

    from bridge_recipes.data.sft_rows import build_sft_rows
    from bridge_recipes.data.synthetic_chat import conversations_jsonl
    from bridge_recipes.runner.cli import main as run_main

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer"
    toy = tmp_path / "toy"
    spec = make_toy(toy, "moe", tokenizer_json=fixture / "tokenizer.json", **TINY, **TINY_MOE)
    assert (toy / "chat_template.jinja").read_bytes() == (fixture / "chat_template.jinja").read_bytes()
    src = tmp_path / "chat.jsonl"
    src.write_text(conversations_jsonl(40, seed=0))
    m = build_sft_rows(src, toy, tmp_path / "rows", row_tokens=1024, val_fraction=0.1, progress=False)
    assert m["conversations"]["skipped_total"] == 0 and m["chat_format"].startswith("chat_template")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = run_main(
            [
                "--recipe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "--scale-down", str(spec.num_layers),
                "--dataset", "sft-rows", "-sl", "1024", "-gb", "4",
                "--hf-checkpoint", str(toy), f"dataset.path={tmp_path / 'rows'}", "--dry-run",
            ]
        )  # fmt: skip
    assert rc == 0, out.getvalue()[-2000:]


def test_vl_toy_is_saved_in_its_dtype_throughout(tmp_path):
    """The text and vision configs carry the toy's dtype (Megatron-Bridge takes a VL model's
    parameter dtype from the text config), and every saved tensor has it."""
    from safetensors import safe_open

    make_toy(tmp_path / "vl", "moe", vl=True, dtype="float32", **TINY, **TINY_MOE)
    cfg = json.loads((tmp_path / "vl" / "config.json").read_text())
    assert cfg["dtype"] == cfg["text_config"]["dtype"] == cfg["vision_config"]["dtype"] == "float32"
    dtypes = set()
    for shard in (tmp_path / "vl").glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            dtypes |= {str(f.get_slice(k).get_dtype()) for k in f.keys()}
    assert dtypes == {"F32"}


def test_round_trip_comparison_names_a_dtype_change(tmp_path):
    import torch
    from safetensors.torch import save_file

    from bridge_recipes.hf import parity

    w = {"a": torch.randn(4, 4), "b": torch.arange(6, dtype=torch.float32)}
    for name, tensors in {
        "orig": w,
        "same": {k: v.clone() for k, v in w.items()},
        "bf16": {k: v.to(torch.bfloat16) for k, v in w.items()},
    }.items():
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "model.safetensors"))
    same = parity.tensors_identical(tmp_path / "orig", tmp_path / "same")
    assert same["bit_identical"] and same["identical"] == 2 and same["dtype_changes"] == []
    cast = parity.tensors_identical(tmp_path / "orig", tmp_path / "bf16")
    assert not cast["bit_identical"] and cast["identical"] == 0
    assert cast["dtype_changes"] == ["torch.float32 -> torch.bfloat16"]


def test_toy_builds_through_the_gpu_path_of_the_gated_norm(tmp_path, monkeypatch):
    """On a GPU with flash-linear-attention, transformers builds each Gated DeltaNet's norm as
    FLA's fused module from config.dtype and the current CUDA device; torch.empty refuses a dtype
    given by name. Simulated on the CPU: the fused module stands in for the GPU's."""
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5 as dense_mod
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as moe_mod

    seen = []

    class FusedLike(dense_mod.Qwen3_5RMSNormGated):
        def __init__(self, hidden_size, eps, activation, device, dtype):
            seen.append(dtype)
            torch.empty(hidden_size, device=device, dtype=dtype)  # what FLA's module does
            super().__init__(hidden_size, eps=eps)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    for mod in (dense_mod, moe_mod):
        monkeypatch.setattr(mod, "FusedRMSNormGated", FusedLike)
    make_toy(tmp_path / "moe", "moe", dtype="float32", **TINY, **TINY_MOE)
    make_toy(tmp_path / "dense", "dense", dtype="bfloat16", ffn_hidden_size=128, **TINY)
    assert seen and set(seen) == {torch.float32, torch.bfloat16}
    assert json.loads((tmp_path / "moe" / "config.json").read_text())["dtype"] == "float32"


def test_a_vl_checkpoint_sets_the_vision_tower_too(tmp_path):
    from bridge_recipes.hf.toy import TOY_VISION

    make_toy(tmp_path / "vl", "moe", vl=True, **TINY, **TINY_MOE)
    changes = []
    cfg = bridge_recipes.build(
        "qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config",
        scale_down=4,
        hf_checkpoint=str(tmp_path / "vl"),
        report=changes.append,
    )
    v = cfg.model.vision_config
    assert (v.depth, v.hidden_size, cfg.model.hidden_size) == (
        TOY_VISION.depth,
        TOY_VISION.hidden_size,
        TINY["hidden_size"],
    )
    (depth,) = [c for c in changes if c.startswith("hf checkpoint: model.vision_config.depth: ")]
    assert depth.endswith(f" -> {TOY_VISION.depth} (from its config.json)")
