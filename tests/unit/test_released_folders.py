"""Released (vision-language form) folders in text recipes: taken, refused when incomplete or of
another family or size, and given back in the same form (vision tower byte for byte, MTP present),
with a LoRA run's adapters alone as a PEFT folder that matches the merged export."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from bridge_recipes.hf import architecture, exporter, importer, released
from bridge_recipes.hf import checkpoint as ck
from bridge_recipes.hf.files import INDEX_FILE, HfCheckpointError, safetensors_header
from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES, make_toy

MOE_LORA = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"
MOE_SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
DENSE_SFT = "qwen35_27b_sft_8gpu_h200_bf16_config"
FIXTURE_TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer" / "tokenizer.json"
TINY = dict(**CPU_SIZES, max_shard_size="300KB")


@pytest.fixture(scope="module")
def toys(tmp_path_factory):
    """CPU-sized toys in the released form (VL, one MTP layer), FP32, with the fixture tokenizer."""
    root = tmp_path_factory.mktemp("released")
    kw = dict(vl=True, mtp_num_layers=1, dtype="float32", tokenizer_json=FIXTURE_TOKENIZER, **TINY)
    make_toy(root / "moe", "moe", **kw, **CPU_MOE_SIZES)
    make_toy(root / "dense", "dense", ffn_hidden_size=128, **kw)
    return root


def copy(toys: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(toys / name, tmp_path / name))


def drop_tensors(folder: Path, prefix: str) -> None:
    """Remove the tensors named ``prefix``* from the folder's shards and index."""
    from safetensors.torch import load_file, save_file

    index = folder / INDEX_FILE
    doc = json.loads(index.read_text())
    for shard in {v for k, v in doc["weight_map"].items() if k.startswith(prefix)}:
        tensors = load_file(str(folder / shard))
        save_file({k: t for k, t in tensors.items() if not k.startswith(prefix)}, str(folder / shard))
    doc["weight_map"] = {k: v for k, v in doc["weight_map"].items() if not k.startswith(prefix)}
    index.write_text(json.dumps(doc))


def names(folder: Path) -> dict[str, str]:
    return json.loads((folder / INDEX_FILE).read_text())["weight_map"]


def runner(argv):
    from bridge_recipes.runner.cli import main

    return main(argv)


# ----------------------------------------------------------------- the toy command


def test_toy_command_makes_the_released_form_unless_text_only_is_asked(tmp_path):
    from bridge_recipes.hf.cli import main

    assert main(["toy", "--out", str(tmp_path / "vl"), "--tokenizer-json", str(FIXTURE_TOKENIZER)]) == 0
    config = json.loads((tmp_path / "vl" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert config["text_config"]["mtp_num_hidden_layers"] == 1
    kinds = {released.kind_of(n) for n in names(tmp_path / "vl")}
    assert kinds == {"language", "mtp", "vision"}
    assert released.released_problem(ck.inspect_folder(tmp_path / "vl")) is None

    assert main(["toy", "--text-only", "--family", "dense", "--out", str(tmp_path / "text")]) == 0
    config = json.loads((tmp_path / "text" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"] and not config.get("mtp_num_hidden_layers")
    assert {released.kind_of(n) for n in names(tmp_path / "text")} == {"language"}


# ----------------------------------------------------------------- taken by text recipes


@pytest.mark.parametrize(("recipe", "family"), [(MOE_LORA, "moe"), (DENSE_SFT, "dense")])
def test_text_recipes_take_the_released_folder_as_its_language_model(toys, recipe, family, tmp_path, monkeypatch):
    monkeypatch.setenv(importer.CACHE_ENV, str(tmp_path / "cache"))
    from bridge_recipes.runner.arguments import build_parser
    from bridge_recipes.runner.cli import build

    argv = ["--recipe", recipe, "--dry-run", "--scale-down", "4", "--hf-checkpoint", str(toys / family)]
    _, cfg = build(build_parser().parse_intermixed_args(argv))
    assert not hasattr(cfg.model, "vision_config")  # a text model: the vision tower is never built
    assert cfg.model.mtp_num_layers == 1 and cfg.model.hidden_size == TINY["hidden_size"]
    folder = ck.inspect_folder(toys / family)
    assert importer.cache_key(folder, True) != importer.cache_key(folder, False)  # never the VL recipes' conversion


def test_the_summary_says_what_is_taken_and_what_is_carried_through(toys, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(importer.CACHE_ENV, str(tmp_path / "cache"))
    export, saved = tmp_path / "export", tmp_path / "run.yaml"
    argv = ["--recipe", MOE_LORA, "--dry-run", "--scale-down", "4", "--hf-checkpoint", str(toys / "moe")]
    argv += ["--save-dir", str(tmp_path / "ckpt"), "--export-hf", str(export), "--save-config", str(saved)]
    assert runner(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    weight_map = names(toys / "moe")
    counts = {k: sum(released.kind_of(n) == k for n in weight_map) for k in ("language", "mtp", "vision")}
    assert re.search(rf"language model \({counts['language']} tensors\).*MTP layer \({counts['mtp']} tensors\)", out)
    assert re.search(rf"carried through unchanged: the vision tower \({counts['vision']} tensors", out)
    assert re.search(
        rf"^export\s+{re.escape(str(export))} .*released form of Qwen3_5MoeForConditionalGeneration", out, re.M
    )
    assert str(released.adapter_folder(export)) in out
    from bridge_recipes.config.files import run_options

    assert "export-text-only" not in run_options(saved)
    assert runner([*argv, "--export-text-only", "--overwrite-config"]) == 0
    assert "the text form" in capsys.readouterr().out
    assert run_options(saved)["export-text-only"] is True


# ----------------------------------------------------------------- refused before launch


def test_a_released_folder_without_its_vision_tower_is_refused(toys, capsys, tmp_path):
    folder = copy(toys, "moe", tmp_path)
    drop_tensors(folder, released.VISION_PREFIX)
    assert runner(["--recipe", MOE_LORA, "--dry-run", "--scale-down", "4", "--hf-checkpoint", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "no vision tower weights" in err and released.VISION_PREFIX in err and "--text-only" in err


def test_a_released_folder_without_its_mtp_layer_is_refused(toys, tmp_path):
    folder = copy(toys, "moe", tmp_path)
    drop_tensors(folder, released.MTP_PREFIX)
    with pytest.raises(HfCheckpointError) as refused:  # its config declares the layer: refused for any recipe
        ck.inspect_folder(folder)
    assert "mtp_num_hidden_layers is 1" in str(refused.value) and "lack MTP layer(s) [0]" in str(refused.value)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    assert "mtp_num_hidden_layers is 0" in released.released_problem(ck.inspect_folder(folder))
    (problem,) = architecture.check_folder_for_recipe(ck.inspect_folder(folder), MOE_SFT, scaled=True)
    assert "MTP layer" in problem


def test_a_released_folder_of_another_family_or_size_is_refused(toys, capsys):
    base = ["--dry-run", "--hf-checkpoint"]
    assert runner(["--recipe", MOE_LORA, *base, str(toys / "dense"), "--scale-down", "4"]) == 2
    assert re.search(r"architecture\b.*'dense text\b.*'MoE text\b", capsys.readouterr().err)
    assert runner(["--recipe", MOE_LORA, *base, str(toys / "moe")]) == 2
    err = capsys.readouterr().err
    assert "not the size of this recipe's model" in err and "hidden_size: checkpoint has 64" in err
    assert "--scale-down 4" in err


def test_an_export_into_the_checkpoint_or_rows_folder_is_refused(toys, tmp_path):
    from bridge_recipes.hf.run_hooks import check_export_target

    save, rows = tmp_path / "ckpt", tmp_path / "rows"
    cfg = SimpleNamespace(
        model=SimpleNamespace(),
        checkpoint=SimpleNamespace(save=str(save), load=None, pretrained_checkpoint=None, hf_source_path=None),
        dataset=SimpleNamespace(path=str(rows)),
        peft=None,
    )
    folder = ck.inspect_folder(toys / "moe")
    for inside, name in ((save / "export", "checkpoint.save"), (rows / "export", "dataset.path")):
        with pytest.raises(ValueError, match=re.escape(name)):
            check_export_target(cfg, str(inside), folder)
    check_export_target(cfg, str(tmp_path / "export"), folder, text_only=True)
    cfg.peft = object()  # a LoRA run: its adapter folder beside the export must be free too
    released.adapter_folder(tmp_path / "export").mkdir()
    (released.adapter_folder(tmp_path / "export") / "x").write_text("mine")
    with pytest.raises(ValueError, match="adapter folder"):
        check_export_target(cfg, str(tmp_path / "export"), folder)
    cfg.model.vision_config = object()  # a VL recipe: no text form to ask for
    with pytest.raises(ValueError, match="--export-text-only"):
        check_export_target(cfg, str(tmp_path / "other"), folder, text_only=True)


def test_convert_checkpoint_export_refuses_the_checkpoint_folder(toys, capsys, tmp_path):
    from bridge_recipes.hf.cli import main

    megatron = tmp_path / "ckpt"
    (megatron / "iter_0000001").mkdir(parents=True)
    (megatron / "latest_checkpointed_iteration.txt").write_text("1")
    argv = ["export", "--megatron", str(megatron), "--hf-template", str(toys / "moe"), "--recipe", MOE_SFT]
    assert main([*argv, "--scaled", "--out", str(megatron / "hf")]) == 2
    assert "inside --megatron" in capsys.readouterr().err


# ----------------------------------------------------------------- the export's routes


def saved_run(folder: Path, *, vl: bool, peft: dict | None) -> Path:
    import yaml

    it = folder / "iter_0000010"
    it.mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("10")
    model = {"num_layers": 4, **({"vision_config": {}} if vl else {})}
    (it / "run_config.yaml").write_text(yaml.safe_dump({"model": model, "checkpoint": {}, "peft": peft}))
    return folder


LORA = {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": 8, "alpha": 16}


def test_the_export_of_a_text_model_of_a_released_folder_takes_the_released_route(toys, tmp_path):
    calls = []

    def fake(kind):
        def convert(megatron, template, out, *rest, **kw):
            calls.append((kind, megatron.name, kw.get("text_only"), (kw.get("adapter_out") or (rest or [None])[0])))
            (out / "model.safetensors").write_bytes(b"x")
            if kw.get("adapter_out") or (rest and rest[0]):
                ((kw.get("adapter_out") or rest[0]) / released.ADAPTER_WEIGHTS).write_bytes(b"x")

        return convert

    kw = dict(progress=False, convert=fake("full"), lora_convert=fake("lora"), released_convert=fake("released"))
    template = toys / "moe"
    exporter.export_checkpoint(saved_run(tmp_path / "text_lora", vl=False, peft=LORA), template, tmp_path / "o1", **kw)
    exporter.export_checkpoint(
        saved_run(tmp_path / "text_full", vl=False, peft=None), template, tmp_path / "o2", text_only=True, **kw
    )
    exporter.export_checkpoint(saved_run(tmp_path / "vl_lora", vl=True, peft=LORA), template, tmp_path / "o3", **kw)
    assert [c[:3] for c in calls] == [
        ("released", "text_lora", False),
        ("released", "text_full", True),
        ("lora", "vl_lora", None),
    ]
    assert calls[0][3] is not None and calls[1][3] is None  # a LoRA run's adapters go beside the export
    assert (released.adapter_folder(tmp_path / "o1") / released.ADAPTER_WEIGHTS).is_file()
    with pytest.raises(HfCheckpointError, match="--export-text-only"):
        exporter.export_checkpoint(tmp_path / "vl_lora", template, tmp_path / "o4", text_only=True, **kw)


# ----------------------------------------------------------------- the export's content (CPU, FP32)


def source_tensors(folder: Path) -> dict:
    from safetensors import safe_open

    out = {}
    for name, file in names(folder).items():
        if released.kind_of(name) != "vision":
            with safe_open(str(folder / file), framework="pt") as f:
                out[name] = f.get_tensor(name)
    return out


def raw_bytes(folder: Path, name: str) -> tuple[str, bytes]:
    """A tensor's dtype and bytes as its shard stores them."""
    file = folder / names(folder)[name]
    header, _ = safetensors_header(file)
    import struct

    with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        start, end = header[name]["data_offsets"]
        f.seek(8 + n + start)
        return header[name]["dtype"], f.read(end - start)


def logits(model, ids):
    import torch

    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
LORA_MODULES += ("out_proj", "down_proj", "gate_proj", "up_proj")


def random_lora(base: dict, rank: int, alpha: float, seed: int) -> tuple[list, dict]:
    """Nonzero random adapters (Hugging Face names) on every module the recipes' LoRA targets, the
    experts' gate and up sharing their A as one adapter on Megatron's fused first projection does;
    and the base tensors with each adapter merged in (W + alpha/rank * B @ A)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    adapters, merged = [], dict(base)

    def add(module: str, a=None):
        out_f, in_f = base[module + ".weight"].shape
        a = torch.randn(rank, in_f, generator=g) * 0.1 if a is None else a
        b = torch.randn(out_f, rank, generator=g) * 0.1
        adapters.extend([(module + ".lora_A.weight", a), (module + ".lora_B.weight", b)])
        merged[module + ".weight"] = merged[module + ".weight"] + alpha / rank * b @ a
        return a

    for name in sorted(base):
        module, _, leaf = name.removesuffix(".weight").rpartition(".")
        if not name.startswith(released.VL_LANGUAGE_PREFIX) or leaf not in LORA_MODULES:
            continue
        if re.search(r"experts\.\d+$", module) and leaf in ("gate_proj", "up_proj"):
            continue  # below: gate and up of one expert share A
        add(f"{module}.{leaf}")
    for module in sorted({n.rsplit(".", 2)[0] for n in base if re.search(r"experts\.\d+\.gate_proj\.weight$", n)}):
        add(module + ".up_proj", add(module + ".gate_proj"))
    return adapters, merged


@pytest.mark.parametrize("family", ["moe", "dense"])
def test_the_export_is_the_released_form_and_its_adapters_equal_the_merged_weights(toys, family, tmp_path):
    import torch
    import transformers
    from peft import PeftModel

    from bridge_recipes.hf.parity import REL_ERR_MAX, compare_logits

    src = toys / family
    folder = ck.inspect_folder(src)
    rank, alpha = 4, 8.0
    adapters, merged = random_lora(source_tensors(src), rank, alpha, seed=1)
    vl, text, adapter = tmp_path / "vl", tmp_path / "text", tmp_path / "adapter"
    report = released.write_export(iter(merged.items()), folder, vl)
    released.write_export(iter(merged.items()), folder, text, text_only=True)
    released.write_adapter(adapters, adapter, rank=rank, alpha=alpha, base_model=str(src))

    # the released form: same class, config and vision tower byte for byte, MTP present, files copied
    assert (vl / "config.json").read_bytes() == (src / "config.json").read_bytes()
    vision = [n for n in names(src) if released.kind_of(n) == "vision"]
    assert vision and all(raw_bytes(vl, n) == raw_bytes(src, n) for n in vision)
    assert report.vision == len(vision) and report.mtp == sum(released.kind_of(n) == "mtp" for n in names(src)) > 0
    assert all(n in names(vl) for n in names(src))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (vl / f).read_bytes() == (src / f).read_bytes()
    cls = getattr(transformers, folder.config["architectures"][0])
    text_cls = getattr(transformers, released.TEXT_ARCHITECTURES[folder.is_moe])
    base = cls.from_pretrained(src, dtype=torch.float32)
    tuned = cls.from_pretrained(vl, dtype=torch.float32)
    assert type(tuned).__name__ == folder.config["architectures"][0]
    assert json.loads((text / "config.json").read_text())["architectures"] == [text_cls.__name__]
    assert not any(released.kind_of(n) == "vision" for n in names(text))

    ids = torch.randint(0, CPU_SIZES["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    tuned_logits = logits(tuned, ids)
    assert (
        compare_logits(logits(text_cls.from_pretrained(text, dtype=torch.float32), ids), tuned_logits)["rel_err"]
        <= REL_ERR_MAX
    )  # the VL form's text logits are the text form's
    assert compare_logits(logits(base, ids), tuned_logits)["rel_err"] > 0.05  # the adapters are in it
    # base + adapter (PEFT) is the merged export
    peft_logits = logits(PeftModel.from_pretrained(base, adapter), ids)
    assert (peft_logits - tuned_logits).abs().max().item() < 1e-4


def test_an_export_missing_its_mtp_layer_or_with_foreign_tensors_is_refused(toys, tmp_path):
    import torch

    folder = ck.inspect_folder(toys / "moe")
    tensors = source_tensors(toys / "moe")
    without_mtp = {k: v for k, v in tensors.items() if released.kind_of(k) != "mtp"}
    with pytest.raises(HfCheckpointError, match=r"lacks \d+ tensor\(s\).*mtp\."):
        released.write_export(iter(without_mtp.items()), folder, tmp_path / "a")
    foreign = {**tensors, "model.language_model.layers.99.mlp.gate.weight": torch.zeros(1)}
    with pytest.raises(HfCheckpointError, match="layers.99"):
        released.write_export(iter(foreign.items()), folder, tmp_path / "b")


def test_adapters_of_one_expert_with_different_a_matrices_are_refused(tmp_path):
    import torch

    a = [
        ("m.experts.0.gate_proj.lora_A.weight", torch.ones(2, 4)),
        ("m.experts.0.gate_proj.lora_B.weight", torch.ones(3, 2)),
        ("m.experts.0.up_proj.lora_A.weight", torch.zeros(2, 4)),
        ("m.experts.0.up_proj.lora_B.weight", torch.ones(3, 2)),
    ]
    with pytest.raises(HfCheckpointError, match="different A matrices"):
        released.write_adapter(a, tmp_path, rank=2, alpha=2, base_model="x")
