"""Hugging Face folders that are not what their config.json says, refused before any work: FP8
releases, folders half there (a section of the config, vision or MTP tensors, index entries
missing, an embedding of another vocabulary), .bin weights, sections of the wrong type, a
vocabulary below the tokenizer's ids. Every tensor the config declares is derived from it
(:mod:`bridge_recipes.hf.declared`) and compared with the shard headers
(:mod:`bridge_recipes.hf.weights_check`), for text and VL recipes alike and in
``convert_checkpoint.py import``; a fuzz test damages a released folder many ways."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge_recipes.hf import checkpoint as ck
from bridge_recipes.hf.declared import declared
from bridge_recipes.hf.files import INDEX_FILE, HfCheckpointError, safetensors_header
from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES, make_toy

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests/fixtures/qwen35_chat_tokenizer/tokenizer.json"
TEXT_LORA = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"
FP8_BASE = "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config"
VL_SFT = "qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config"
TINY = dict(**CPU_SIZES, max_shard_size="300KB", tokenizer_json=TOKENIZER)
MEGATRON_LINE = "loading Megatron-Bridge"  # the runner prints it before the import: a refusal without it came first


@pytest.fixture(scope="module")
def toys(tmp_path_factory) -> Path:
    """CPU-sized toys saved by transformers' classes: the released form (VL, one MTP layer) of each
    family and the text form of each."""
    root = tmp_path_factory.mktemp("round6_folders")
    make_toy(root / "moe", "moe", vl=True, mtp_num_layers=1, **TINY, **CPU_MOE_SIZES)
    make_toy(root / "dense", "dense", vl=True, mtp_num_layers=1, ffn_hidden_size=128, **TINY)
    make_toy(root / "moe_text", "moe", **TINY, **CPU_MOE_SIZES)
    make_toy(root / "dense_text", "dense", ffn_hidden_size=128, **TINY)
    return root


def copy(toys: Path, dest: Path, name: str = "moe") -> Path:
    return Path(shutil.copytree(toys / name, dest))


def index_of(folder: Path) -> dict:
    return json.loads((folder / INDEX_FILE).read_text())


def write_index(folder: Path, doc: dict) -> None:
    (folder / INDEX_FILE).write_text(json.dumps(doc))


def rewrite_shards(folder: Path, change) -> None:
    """Each shard's tensors through ``change(name, tensor) -> {name: tensor}``, the index following."""
    from safetensors.torch import load_file, save_file

    doc = index_of(folder)
    weight_map = {}
    for shard in sorted(set(doc["weight_map"].values())):
        out = {}
        for name, tensor in load_file(str(folder / shard)).items():
            out.update(change(name, tensor))
        save_file(out, str(folder / shard))
        weight_map.update(dict.fromkeys(out, shard))
    doc["weight_map"] = weight_map
    write_index(folder, doc)


def drop(folder: Path, prefix: str, keep: int = 0, index_only: bool = False) -> list[str]:
    """Remove the tensors named ``prefix``* but the first ``keep`` (from the index only, or from the shards too)."""
    doc = index_of(folder)
    gone = sorted(n for n in doc["weight_map"] if n.startswith(prefix))[keep:]
    if index_only:
        doc["weight_map"] = {k: v for k, v in doc["weight_map"].items() if k not in gone}
        write_index(folder, doc)
    else:
        rewrite_shards(folder, lambda n, t: {} if n in gone else {n: t})
    return gone


def set_config(folder: Path, key: str, value=None, delete: bool = False) -> None:
    config = json.loads((folder / "config.json").read_text())
    *path, leaf = key.split(".")
    holder = config
    for part in path:
        holder = holder[part]
    if delete:
        holder.pop(leaf)
    else:
        holder[leaf] = value
    (folder / "config.json").write_text(json.dumps(config))


def to_fp8(folder: Path, with_config: bool = True, with_scales: bool = True) -> int:
    """The -FP8 release form: projection weights as F8_E4M3 with a *.weight_scale_inv beside each, and
    config.json's quantization_config; the number of scale tensors."""
    import torch

    def change(name, t):
        if not (name.endswith("_proj.weight") and t.ndim == 2 and not name.startswith("model.visual.")):
            return {name: t}
        out = {name: t.to(torch.float8_e4m3fn)}
        if with_scales:
            out[name.removesuffix("weight") + "weight_scale_inv"] = torch.ones((t.shape[0] + 127) // 128, 1)
        return out

    rewrite_shards(folder, change)
    if with_config:
        q = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
        set_config(folder, "quantization_config", q)
    return sum(n.endswith("_scale_inv") for n in index_of(folder)["weight_map"])


def runner(capsys, *argv) -> tuple[int, str]:
    from bridge_recipes.runner.cli import main

    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def dry_run(capsys, folder: Path, recipe: str = TEXT_LORA) -> tuple[int, str]:
    return runner(capsys, "--recipe", recipe, "--scale-down", "4", "--hf-checkpoint", folder, "--dry-run")


def convert(capsys, *argv) -> tuple[int, str]:
    from bridge_recipes.hf.cli import main

    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def imported(capsys, folder: Path, out: Path) -> tuple[int, str]:
    return convert(capsys, "import", "--hf", folder, "--recipe", TEXT_LORA, "--scaled", "--out", out, "--no-progress")


# ----------------------------------------------------------------- what a config declares


@pytest.mark.parametrize("name", ["moe", "dense", "moe_text", "dense_text"])
def test_the_declared_tensors_are_those_transformers_saves(toys, name):
    """Names and shapes derived from config.json are exactly what transformers' save_pretrained wrote
    (plus the MTP layer a released folder carries), for each family and form."""
    folder = ck.inspect_folder(toys / name)
    held = {}
    for shard in folder.shards:
        header, _ = safetensors_header(shard)
        held |= {n: e["shape"] for n, e in header.items() if n != "__metadata__"}
    want = declared(folder.config, folder.is_vl, folder.is_moe, held)
    assert {n: [v for v, _ in t.shape] for n, t in want.items()} == held


def test_routed_experts_stacked_per_layer_are_taken_and_their_shapes_checked(toys, tmp_path):
    """Some releases store a layer's routed experts as two stacked tensors (experts.gate_up_proj,
    experts.down_proj): taken when their shapes fit the config, refused when not."""
    import torch

    layer = "model.language_model.layers.0.mlp.experts."

    def stack(rows: int):
        def change(name, t):
            if not name.startswith(layer):
                return {name: t}
            if name == f"{layer}0.down_proj.weight":
                e = CPU_MOE_SIZES["num_experts"]
                i, h = CPU_MOE_SIZES["moe_ffn_hidden_size"], CPU_SIZES["hidden_size"]
                return {f"{layer}gate_up_proj": torch.zeros(e, rows * i, h), f"{layer}down_proj": torch.zeros(e, h, i)}
            return {}

        return change

    good = copy(toys, tmp_path / "good")
    rewrite_shards(good, stack(2))
    ck.inspect_folder(good)
    bad = copy(toys, tmp_path / "bad")
    rewrite_shards(bad, stack(3))
    with pytest.raises(HfCheckpointError, match=re.escape(f"{layer}gate_up_proj has shape")):
        ck.inspect_folder(bad)


# ----------------------------------------------------------------- 3: FP8 releases


@pytest.mark.parametrize("recipe", [TEXT_LORA, FP8_BASE])
def test_an_fp8_release_is_refused_before_any_work_naming_the_bf16_release(toys, tmp_path, capsys, recipe):
    folder = copy(toys, tmp_path / "Qwen3.6-35B-A3B-FP8")
    scales = to_fp8(folder)
    rc, err = dry_run(capsys, folder, recipe)
    assert rc == 2 and MEGATRON_LINE not in err and "Traceback" not in err
    assert str(folder) in err and "quantization_config quant_method 'fp8'" in err
    assert f"{scales} scale tensor(s)" in err and "Qwen/Qwen3.6-35B-A3B instead of Qwen3.6-35B-A3B-FP8" in err
    rc, err = imported(capsys, folder, tmp_path / "out")
    assert rc == 2 and f"{scales} scale tensor(s)" in err and "the checks passed" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("form", ["no quantization_config", "no scales either"])
def test_fp8_weights_are_refused_whatever_else_was_lost(toys, tmp_path, form):
    folder = copy(toys, tmp_path / "fp8")
    to_fp8(folder, with_config=False, with_scales=form == "no quantization_config")
    with pytest.raises(
        HfCheckpointError, match=r"is an FP8 release .*(scale tensor|F8_E4M3).*download the BF16 release"
    ):
        ck.inspect_folder(folder)


# ----------------------------------------------------------------- 4: released folders half there


def _no_vision_config(f: Path) -> None:
    set_config(f, "vision_config", delete=True)


HALF_THERE = {
    "4a vision_config missing": (_no_vision_config, r"config\.json: vision_config is missing"),
    "4b 15 of 33 vision tensors": (
        lambda f: drop(f, "model.visual.", keep=15),
        r"lacks \d+ of the \d+ vision tower tensors .*vision_config\.depth",
    ),
    "4c some MTP tensors": (lambda f: drop(f, "mtp.", keep=16), r"lacks \d+ of the \d+ MTP layer tensors"),
    "4d index omits a layer": (
        lambda f: drop(f, "model.language_model.layers.3.", index_only=True),
        r"model\.safetensors\.index\.json does not list \d+ tensor\(s\) .*layers\.3\.\*",
    ),
    "4e vocab_size over the embedding": (
        lambda f: set_config(f, "text_config.vocab_size", 2 * CPU_SIZES["vocab_size"]),
        rf"text_config\.vocab_size is {2 * CPU_SIZES['vocab_size']}, .* has {CPU_SIZES['vocab_size']} rows",
    ),
}


@pytest.mark.parametrize("case", sorted(HALF_THERE))
def test_a_released_folder_half_there_is_refused_by_the_runner_and_the_import(toys, tmp_path, capsys, case):
    damage, message = HALF_THERE[case]
    folder = copy(toys, tmp_path / "half")
    damage(folder)
    rc, err = dry_run(capsys, folder)
    assert rc == 2 and re.search(message, err) and MEGATRON_LINE not in err and "Traceback" not in err
    assert str(folder) in err
    rc, err = imported(capsys, folder, tmp_path / "out")
    assert rc == 2 and re.search(message, err) and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("case", "message"),
    [("no vision tensors", r"holds no vision tower weights"), ("no vision_config", r"vision_config is missing")],
)
def test_a_vl_recipe_refuses_a_folder_without_its_vision_tower(toys, tmp_path, capsys, case, message):
    folder = copy(toys, tmp_path / "vl")
    if case == "no vision tensors":
        drop(folder, "model.visual.")
    else:
        _no_vision_config(folder)
    rc, err = dry_run(capsys, folder, VL_SFT)
    assert rc == 2 and re.search(message, err) and MEGATRON_LINE not in err


# ----------------------------------------------------------------- 8a-8c


def test_bin_weights_are_named_with_a_conversion_that_keeps_every_tensor(toys, tmp_path, capsys):
    import torch
    from safetensors.torch import load_file

    folder = copy(toys, tmp_path / "bin")
    doc = index_of(folder)
    tensors, weight_map = {}, {}
    shards = sorted(set(doc["weight_map"].values()))
    for n, shard in enumerate(shards, 1):
        part, name = load_file(str(folder / shard)), f"pytorch_model-{n:05d}-of-{len(shards):05d}.bin"
        tensors |= part
        weight_map |= dict.fromkeys(part, name)
        torch.save(part, folder / name)
        (folder / shard).unlink()
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / INDEX_FILE).unlink()
    rc, err = dry_run(capsys, folder)
    assert rc == 2 and "PyTorch .bin weights" in err and "holds no weights" not in err
    command = re.search(r"python (scripts/convert_checkpoint\.py safetensors --hf \S+ --out \S+)", err)
    assert command, err
    argv = command[1].split()[1:]
    assert argv[argv.index("--hf") + 1] == str(folder)
    rc, _ = convert(capsys, *argv)
    out = Path(argv[argv.index("--out") + 1])
    assert rc == 0
    converted = ck.inspect_folder(out)  # whole: every declared tensor, MTP layer included
    held = {}
    for shard in converted.shards:
        held |= load_file(str(shard))
    assert held.keys() == tensors.keys() and all(torch.equal(held[k], tensors[k]) for k in tensors)


@pytest.mark.parametrize("value", ["none", 5, [], None])
@pytest.mark.parametrize("section", ["vision_config", "text_config"])
def test_a_config_section_of_the_wrong_type_is_named_before_megatron(toys, tmp_path, capsys, section, value):
    folder = copy(toys, tmp_path / "typed")
    set_config(folder, section, value)
    rc, err = dry_run(capsys, folder, VL_SFT)
    assert rc == 2 and f"{section} is " in err and MEGATRON_LINE not in err and "network" not in err


def test_a_vocabulary_below_the_tokenizer_names_the_folders_own_disagreement(toys, tmp_path, capsys):
    folder = copy(toys, tmp_path / "vocab")
    set_config(folder, "text_config.vocab_size", 256)
    rc, err = dry_run(capsys, folder)
    largest = max(json.loads(TOKENIZER.read_text())["model"]["vocab"].values())
    assert rc == 2 and "vocab_size is 256, but the embedding" in err and f"{CPU_SIZES['vocab_size']} rows" in err
    assert f"largest token id is {largest}" in err and f"vocab_size to {CPU_SIZES['vocab_size']}" in err
    assert "dataset.vocab_size" not in err and "model.vocab_size" not in err


def test_a_tokenizer_beyond_the_embedding_is_named(toys, tmp_path):
    folder = copy(toys, tmp_path / "tokens")
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["added_tokens"].append({**tok["added_tokens"][-1], "id": 5000, "content": "<|far|>"})
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(HfCheckpointError, match=r"token ids up to 5000, but the embedding .* 1024 rows"):
        ck.inspect_folder(folder)


# ----------------------------------------------------------------- fuzz: damaged released folders


def _names(folder: Path) -> list[str]:
    return sorted(index_of(folder)["weight_map"])


def _header_edit(folder: Path, name: str, edit) -> None:
    """Rewrite the shard header entry of tensor ``name`` in place (its data untouched)."""
    shard = folder / index_of(folder)["weight_map"][name]
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header, name)
    raw = json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def _damage(folder: Path, kind: str, pick: int, value) -> None:
    names = _names(folder)
    name = names[pick % len(names)]
    doc = index_of(folder)
    if kind == "drop tensor":
        rewrite_shards(folder, lambda n, t: {} if n == name else {n: t})
    elif kind == "rename tensor":
        rewrite_shards(folder, lambda n, t: {(n + "_x" if n == name else n): t})
    elif kind == "index entry deleted":
        doc["weight_map"].pop(name)
        write_index(folder, doc)
    elif kind == "truncate shard":
        shard = folder / doc["weight_map"][name]
        shard.write_bytes(shard.read_bytes()[: -1 - pick % 100])
    elif kind == "dtype in header":
        _header_edit(folder, name, lambda h, n: h[n].update(dtype=str(value) if value != "same" else "I16"))
    elif kind == "shape in header":
        _header_edit(folder, name, lambda h, n: h[n].update(shape=list(reversed(h[n]["shape"])) + [1]))
    else:  # a config field the shapes follow, set to another value
        section, field = kind.split(" ")[1].split(".")
        config = json.loads((folder / "config.json").read_text())
        old = config[section].get(field)
        config[section][field] = value if value != old else (old or 0) + 1
        (folder / "config.json").write_text(json.dumps(config))


DAMAGE = [
    "drop tensor",
    "rename tensor",
    "index entry deleted",
    "truncate shard",
    "dtype in header",
    "shape in header",
    *(
        f"config {f}"
        for f in (
            "text_config.hidden_size",
            "text_config.num_hidden_layers",
            "text_config.num_attention_heads",
            "text_config.head_dim",
            "text_config.num_experts",
            "text_config.moe_intermediate_size",
            "text_config.linear_num_value_heads",
            "text_config.mtp_num_hidden_layers",
            "text_config.vocab_size",
            "vision_config.depth",
            "vision_config.hidden_size",
            "vision_config.out_hidden_size",
        )
    ),
]
VALUES = st.one_of(
    st.integers(min_value=-3, max_value=2**40),
    st.sampled_from(["same", "F8_E4M3", "I32", "BOOL", "BF16x", None, 2.5, "64", [], {}]),
)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(DAMAGE), pick=st.integers(min_value=0, max_value=10**6), value=VALUES)
def test_fuzz_a_damaged_released_folder_is_refused_naming_it(toys, kind, pick, value):
    """Each damage that would break the conversion or the export: exit 2 from convert_checkpoint.py
    import naming the folder or one of its files, never a traceback, never past the checks."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy(toys, Path(tmp) / "released")
        _damage(folder, kind, pick, value)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            from bridge_recipes.hf.cli import main

            rc = main(["import", "--hf", str(folder), "--recipe", TEXT_LORA, "--scaled", "--out", f"{tmp}/o"])
        text = err.getvalue()
        assert rc == 2 and "Traceback" not in text and "the checks passed" not in text, (kind, text)
        assert str(folder) in text or any(f.name in text for f in folder.iterdir()), text
