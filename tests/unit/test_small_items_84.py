"""Smaller gaps a new user meets: the converter takes the runner's ``qwen36_`` names, ``--dedupe`` removes
training conversations that are in the validation split, ShareGPT ``chatgpt`` / ``bing`` turns are
the assistant's (and ``--role-map`` maps any other name), the cards users type for ``--gpu``, the disk a
run writes, and the rows per step and learning rate of the LoRA recipes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.chat import chat_formats
from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.data.split_packing import IN_VALIDATION
from bridge_recipes.hf import architecture, importer
from bridge_recipes.hf import checkpoint as ck
from bridge_recipes.hf.files import HfCheckpointError
from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES, make_toy
from bridge_recipes.recipes import registry

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "tests/fixtures/qwen35_chat_tokenizer"
ROW = 256


def jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def conv(i: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"what is {i} plus {i}?"},
            {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
        ]
    }


def run_script(script: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )


# ----------------------------------------------------------------- a. qwen36_ names in the converter


@pytest.fixture(scope="module")
def moe_toy(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("toy") / "moe"
    make_toy(folder, "moe", **CPU_SIZES, **CPU_MOE_SIZES, max_shard_size="300KB")
    return folder


def _fake_convert(src: Path, out: Path) -> None:
    (out / "iter_0000000").mkdir()
    (out / "latest_checkpointed_iteration.txt").write_text("0")


@pytest.mark.parametrize("name", sorted(n for n in registry.aliases() if "_35b_a3b_" in n)[:3])
def test_the_converter_takes_every_qwen36_name_the_runner_lists(name):
    entry = registry.find(name)
    assert architecture.spec_for_recipe(name).name == entry.model == registry.find(entry.alias_of).model


def test_a_qwen36_recipe_imports_and_checks_like_its_qwen35_twin(moe_toy, tmp_path):
    name = "qwen36_35b_a3b_peft_1gpu_l40s_fp8base_config"
    out = importer.import_checkpoint(moe_toy, tmp_path / "mcore", recipe=name, scaled=True, convert=_fake_convert)
    assert ck.is_megatron_checkpoint(out)
    folder = ck.inspect_folder(moe_toy)
    assert architecture.check_folder_for_recipe(folder, name) == architecture.check_folder_for_recipe(
        folder, registry.find(name).alias_of
    )
    assert architecture.check_folder_for_recipe(folder, name)  # a toy is not the full-size model: still checked


def test_the_converter_command_reaches_the_conversion_with_a_qwen36_name(moe_toy, capsys, tmp_path):
    from bridge_recipes.hf.cli import main

    rc = main(
        ["import", "--hf", str(moe_toy), "--recipe", "qwen36_35b_a3b_sft_8gpu_h200_bf16_config"]
        + ["--out", str(tmp_path / "o"), "--scaled", "--no-progress"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "CUDA GPU" in err and "cannot tell the model" not in err  # stopped only for want of a GPU


def test_a_qwen36_name_of_a_size_without_a_qwen36_checkpoint_names_the_sizes():
    with pytest.raises(HfCheckpointError, match=r"'qwen36_122b_a10b_sft_config'.*qwen35_35b_a3b"):
        architecture.spec_for_recipe("qwen36_122b_a10b_sft_config")
    # a catalog name, as qwen35_35b_a3b is
    assert architecture.spec_for_recipe("qwen36_35b_a3b").name == "qwen35_35b_a3b"


# ----------------------------------------------------------------- b. --dedupe across the splits


def test_dedupe_removes_training_conversations_that_are_in_the_validation_split(tmp_path):
    val = [conv(100 + i) for i in range(4)] + [conv(i) for i in range(3)]
    val_file = jsonl(tmp_path / "val.jsonl", val)
    train = [conv(i) for i in range(12)] + [conv(0)]  # conversation 0 twice: both copies are removed
    train_file = jsonl(tmp_path / "train.jsonl", train)
    common = ["--input", train_file, "--tokenizer", TEMPLATE, "--row-tokens", ROW, "--no-progress"]
    p = run_script("build_sft_rows.py", *common, "--val-input", val_file, "--out", tmp_path / "d", "--dedupe")
    assert p.returncode == 0, p.stderr
    m = json.loads((tmp_path / "d/manifest.json").read_text())
    assert m["conversations"]["skipped"] == {IN_VALIDATION: 4} and m["conversations"]["used"] == 9
    assert m["validation"]["conversations_removed_from_training"] == 4
    assert m["validation"]["conversations_also_in_training"] == 0
    assert m["validation"]["conversations"]["used"] == 7  # the validation split is kept whole
    assert re.search(rf"skipped\s+4\s+{IN_VALIDATION}", p.stdout) and re.search(r"removed\s+4\b", p.stdout)
    assert "also in the validation split" not in p.stdout
    kept = run_script("build_sft_rows.py", *common, "--val-input", val_file, "--out", tmp_path / "k")
    k = json.loads((tmp_path / "k/manifest.json").read_text())
    assert (
        k["validation"]["conversations_also_in_training"] == 4
        and k["validation"]["conversations_removed_from_training"] == 0
    )
    assert "--dedupe" in kept.stdout and "remove the duplicates from the data" not in kept.stdout + kept.stderr


def test_dedupe_with_a_validation_fraction_leaves_no_conversation_in_both(tmp_path):
    records = [conv(i) for i in range(20)] * 2  # every conversation twice: the fraction's copies meet training's
    kw = dict(row_tokens=ROW, progress=False, val_fraction=0.2)
    plain = build_sft_rows(jsonl(tmp_path / "a.jsonl", records), TEMPLATE, tmp_path / "plain", **kw)
    assert plain["validation"]["conversations_also_in_training"] > 0
    m = build_sft_rows(jsonl(tmp_path / "b.jsonl", records), TEMPLATE, tmp_path / "dd", dedupe=True, **kw)
    removed = m["conversations"]["skipped"][IN_VALIDATION]
    assert removed == m["validation"]["conversations_removed_from_training"] > 0
    assert m["validation"]["conversations_also_in_training"] == 0
    assert m["conversations"]["used"] + m["validation"]["conversations"]["used"] == 20


# ----------------------------------------------------------------- c. speaker names of real ShareGPT dumps


def sharegpt(assistant: str, i: int = 0, user: str = "human") -> dict:
    return {
        "conversations": [
            {"from": user, "value": f"what is {i} plus {i}?"},
            {"from": assistant, "value": f"{i} plus {i} is {2 * i}."},
        ]
    }


def test_chatgpt_and_bing_turns_are_the_assistant_s(tmp_path):
    kw = dict(row_tokens=ROW, progress=False)
    named = [sharegpt("chatgpt", 0), sharegpt("bing", 1), sharegpt("gpt", 2)]
    got = build_sft_rows(jsonl(tmp_path / "named.jsonl", named), TEMPLATE, tmp_path / "named", **kw)
    plain = [sharegpt("gpt", i) for i in range(3)]
    want = build_sft_rows(jsonl(tmp_path / "plain.jsonl", plain), TEMPLATE, tmp_path / "plain", **kw)
    assert got["conversations"]["skipped"] == {} and got["conversations"]["used"] == 3
    assert got["rows_sha256"] == want["rows_sha256"]  # the same rows as the assistant's turns give
    assert got["conversations"]["notes"] == {"role_mapped:bing=assistant": 1, "role_mapped:chatgpt=assistant": 1}


def test_role_map_reads_any_name_and_the_summary_reports_it(tmp_path):
    records = [sharegpt("model", i, user="person") for i in range(4)] + [sharegpt("chatgpt", 9)]
    src = jsonl(tmp_path / "in.jsonl", records)
    common = ["--input", src, "--tokenizer", TEMPLATE, "--row-tokens", ROW, "--no-progress"]
    unmapped = build_sft_rows(src, TEMPLATE, tmp_path / "u", row_tokens=ROW, progress=False)
    assert unmapped["conversations"]["skipped"] == {"unknown_role": 4}
    assert all("--role-map person=ROLE" in e for e in unmapped["conversations"]["skipped_examples"])
    p = run_script(
        "build_sft_rows.py",
        *common,
        "--out",
        tmp_path / "m",
        "--role-map",
        "model=assistant",
        "--role-map",
        "person=user",
    )
    assert p.returncode == 0, p.stderr
    m = json.loads((tmp_path / "m/manifest.json").read_text())
    assert m["conversations"]["used"] == 5 and m["conversations"]["skipped"] == {}
    assert m["role_map"]["model"] == "assistant" and m["role_map"]["person"] == "user"
    assert m["conversations"]["notes"]["role_mapped:model=assistant"] == 4
    assert re.search(r"note\s+4\s+turn\(s\) from 'model' read as assistant \(--role-map model=assistant\)", p.stdout)
    assert re.search(r"note\s+1\s+turn\(s\) from 'chatgpt' read as assistant \(default\)", p.stdout)


@pytest.mark.parametrize("bad", [["model"], ["model=robot"], ["=assistant"], ["model=user", "model=assistant"]])
def test_a_role_map_that_is_not_name_equals_role_is_refused_naming_the_option(bad):
    with pytest.raises(SftRowsError, match="--role-map"):
        chat_formats.parse_role_map(bad)
    assert chat_formats.parse_role_map(["model = assistant", "model=assistant"]) == {"model": "assistant"}


def test_a_bad_role_map_exits_2_and_writes_nothing(tmp_path):
    src = jsonl(tmp_path / "in.jsonl", [sharegpt("gpt")])
    args = ["--input", src, "--tokenizer", TEMPLATE, "--out", tmp_path / "o", "--role-map", "model=robot"]
    p = run_script("build_sft_rows.py", *args)
    assert p.returncode == 2 and "--role-map 'model=robot'" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "o").exists()


def test_the_role_map_applies_to_parquet_and_openai_records(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {"messages": [{"role": "human", "content": f"q{i}?"}, {"role": "bot", "content": f"a{i}."}]} for i in range(3)
    ]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "in.parquet")
    m = build_sft_rows(
        tmp_path / "in.parquet", TEMPLATE, tmp_path / "o", row_tokens=ROW, progress=False,
        role_map={"human": "user", "bot": "assistant"},
    )  # fmt: skip
    assert m["conversations"]["used"] == 3
    assert m["conversations"]["notes"] == {"role_mapped:bot=assistant": 3, "role_mapped:human=user": 3}


# ----------------------------------------------------------------- d. the cards users name with --gpu

NEW_CARDS = {  # spellings users type or torch prints -> (table key, sold as GB, FP8)
    ("h100-pcie", "NVIDIA H100 PCIe", "h100 pcie"): ("H100-PCIE", 80, True),
    ("h100-nvl", "NVIDIA H100 NVL", "H100NVL"): ("H100-NVL", 94, True),
    ("rtx6000ada", "rtx-6000-ada", "RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation"): ("L40S", 48, True),
    ("l40", "NVIDIA L40", "L40-48"): ("L40", 48, True),
    ("a6000", "RTX A6000", "nvidia-rtx-a6000"): ("A6000", 48, False),
    ("rtx4090", "4090", "RTX 4090", "NVIDIA GeForce RTX 4090"): ("RTX4090", 24, True),
    ("rtx5090", "5090", "rtx-5090", "NVIDIA GeForce RTX 5090"): ("RTX5090", 32, True),
}


@pytest.mark.parametrize("spellings", sorted(NEW_CARDS))
def test_gpu_knows_the_cards_by_the_names_users_type(spellings):
    from bridge_recipes.hardware.gpus import GIB, GPUS, card_by_name

    key, sold_gb, fp8 = NEW_CARDS[spellings]
    for name in spellings:
        assert card_by_name(name) is GPUS[key], name
    card = GPUS[key]
    assert card.memory_gb == sold_gb and card.fp8 is fp8
    # the memory CUDA reports: below the size the card is sold as, read as GiB (the driver keeps part of it)
    assert 0.9 * sold_gb * GIB < card.memory_bytes < sold_gb * GIB


def test_fp8_and_mxfp8_follow_the_architecture():
    from bridge_recipes.hardware.gpus import GPUS, has_mxfp8

    assert [GPUS[k].fp8 for k in ("A100", "A6000")] == [False, False]  # Ampere
    assert all(GPUS[k].fp8 for k in ("L40", "RTX4090", "H100-PCIE", "H100-NVL", "RTX5090", "B200"))
    assert has_mxfp8(GPUS["B200"].capability) and has_mxfp8(GPUS["GB300"].capability)
    assert not has_mxfp8(GPUS["RTX5090"].capability)  # Transformer Engine has no MXFP8 on 12.x
    assert not has_mxfp8(GPUS["H100-NVL"].capability)


def test_the_card_table_in_the_docs_is_the_code_s():
    from bridge_recipes.hardware.gpus import GPUS, card_by_name

    text = (ROOT / "docs/memory_plan.md").read_text()
    rows = re.findall(r"^\| (`[^|]+`) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| (yes|no) \|$", text, re.M)
    assert {card_by_name(re.findall(r"`([^`]+)`", names)[0]).name for names, *_ in rows} == {
        g.name for g in GPUS.values()
    }
    for names, sold, reported, capability, fp8 in rows:
        for name in re.findall(r"`([^`]+)`", names):
            card = card_by_name(name)
            assert (card.memory_gb, f"{card.usable_memory_gb:.1f}") == (int(sold), reported), name
            assert f"{card.capability[0]}.{card.capability[1]}" == capability and card.fp8 is (fp8 == "yes")


@pytest.mark.parametrize("gpu", ["h100-pcie", "h100 nvl", "rtx-6000-ada", "l40", "rtx4090", "rtx5090"])
def test_plan_for_each_card_takes_its_memory(gpu, capsys):
    from bridge_recipes.hardware.gpus import card_by_name
    from bridge_recipes.runner.cli import main

    card = card_by_name(gpu)
    code = main(["--recipe", "qwen35_27b_peft_1gpu_l40s_fp8base_config", "--plan", "--gpu", gpu])
    out = capsys.readouterr().out
    peak, memory = map(float, re.search(r"peak: stage 0, ([\d.]+) of ([\d.]+) GB", out).groups())
    assert memory == round(card.usable_memory_gb, 1)
    assert code == (0 if peak <= card.usable_memory_gb else 2)


def test_plan_for_a_card_without_fp8_refuses_an_fp8_recipe(capsys):
    from bridge_recipes.runner.cli import main

    code = main(["--recipe", "qwen35_27b_peft_1gpu_l40s_fp8base_config", "--plan", "--gpu", "RTX A6000"])
    err = capsys.readouterr().err
    assert code == 2 and re.search(r"uses FP8\b.*\bA6000 \(compute capability 8\.6\)", err), err[-800:]
    assert main(["--recipe", "qwen35_27b_peft_1gpu_a100_bf16_config", "--plan", "--gpu", "a6000"]) in (0, 2)
    assert "uses FP8" not in capsys.readouterr().err


# ----------------------------------------------------------------- e. disk needs, f. rows per step and learning rate

SIZES = {"27B": "qwen35_27b", "35B-A3B": "qwen35_35b_a3b"}


def lora_recipes(model: str) -> list[str]:
    return sorted(
        e.name
        for e in registry.discover().values()
        if e.model == model and e.meta.task == "peft" and e.tree == "bridge_recipes"
    )


def doc_table(page: str, heading: str) -> list[list[str]]:
    """The rows of the first table under ``## heading`` in docs/``page`` (cells stripped)."""
    text = (ROOT / "docs" / page).read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("|")]
    table = rows[: next((i for i, r in enumerate(rows[2:], 2) if not r.startswith("|")), len(rows))]
    first = [[c.strip() for c in r.strip("|").split("|")] for r in table[2:]]
    return first[: next((i for i, r in enumerate(first) if len(r) != len(first[0])), len(first))]


def test_the_disk_table_of_the_lora_page_is_the_code_s():
    from bridge_recipes.models.params import count_parameters
    from bridge_recipes.models.qwen35 import SPECS
    from bridge_recipes.plan import disk
    from bridge_recipes.plan.dims import model_dims

    rows = {r[0].split(" (")[0].split(":")[0]: r[1:] for r in doc_table("lora.md", "Disk")}
    text = (ROOT / "docs/lora.md").read_text()
    for column, model in enumerate(SIZES.values()):
        released = count_parameters(SPECS[model.replace("qwen35_", "qwen35_vl_")])
        found = set()
        for name in lora_recipes(model):
            cfg = registry.load(name)()
            run = disk.run_disk(
                cfg, model_dims(cfg.model), export=True, export_vision=released.vision, conversion_vision=0
            )
            found.add(
                (
                    disk.amount(run.checkpoint_gb),
                    disk.amount(run.merged_gb),
                    disk.amount(run.adapter_gb),
                    disk.amount(run.conversion_gb),
                )
            )
            assert f"{disk.trained_params(cfg, model_dims(cfg.model)) / 1e6:.1f}M" in text
        (checkpoint, merged, adapter, conversion), *others = sorted(found)
        assert others == []  # one figure per size, as the page says
        assert rows["the released Hugging Face folder"][column] == disk.amount(2 * released.total / 1e9) == merged
        assert rows["its conversion in `$QWEN35_RECIPES_CACHE/hf_import`"][column] == conversion
        assert rows["a checkpoint"][column] == checkpoint
        assert rows["the merged export"][column] == merged and rows["the adapter folder"][column] == adapter


def test_the_disk_line_of_running_md_is_what_the_dry_run_prints_for_its_run():
    from bridge_recipes.config.builder import build
    from bridge_recipes.models.params import count_parameters
    from bridge_recipes.models.qwen35 import SPECS
    from bridge_recipes.plan import disk
    from bridge_recipes.plan.dims import model_dims

    text = (ROOT / "docs/running.md").read_text()
    (line,) = re.findall(r"^    disk {14}(.*)$", text, re.M)
    assert "--max-steps 1000 --save-interval 100 checkpoint.most_recent_k=2" in text
    cfg = build(
        "qwen36_27b_peft_1gpu_l40s_fp8base_config",
        flags={"max_steps": 1000, "save_interval": 100},
        overrides=["checkpoint.most_recent_k=2"],
    )
    vision = count_parameters(SPECS["qwen35_vl_27b"]).vision
    run = disk.run_disk(cfg, model_dims(cfg.model), export=True, export_vision=vision, conversion_vision=0)
    assert line == run.line()
    assert (run.saves, run.kept) == (10, 2)
    assert run.written_gb == pytest.approx(2 * run.checkpoint_gb + run.merged_gb + run.adapter_gb)


def test_checkpoints_written_and_kept_follow_the_interval_the_last_step_and_most_recent_k():
    from types import SimpleNamespace as NS

    from bridge_recipes.plan import disk

    def cfg(steps, every, k=-1, save="/ckpt"):
        return NS(checkpoint=NS(save=save, save_interval=every, most_recent_k=k), train=NS(train_iters=steps))

    assert [disk.saves(cfg(s, 100)) for s in (50, 100, 101, 1000)] == [1, 1, 2, 10]  # the last step is saved too
    assert disk.saves(cfg(100, None)) == 1 and disk.saves(cfg(100, 10, save=None)) == 0
    assert (disk.kept(cfg(1000, 100, 3)), disk.kept(cfg(1000, 100, -1)), disk.kept(cfg(200, 100, 5))) == (3, 10, 2)


def test_a_full_fine_tune_checkpoint_holds_the_model_and_its_optimizer_state():
    from bridge_recipes.models.params import count_parameters
    from bridge_recipes.models.qwen35 import SPECS
    from bridge_recipes.plan import disk
    from bridge_recipes.plan.dims import model_dims
    from bridge_recipes.plan.optimizer import optimizer_bytes_per_param

    cfg = registry.load("qwen35_27b_sft_8gpu_h200_bf16_config")()
    params = count_parameters(SPECS["qwen35_27b"]).total
    assert disk.checkpoint_bytes(cfg, model_dims(cfg.model)) == (2 + optimizer_bytes_per_param(cfg)) * params
    text = re.sub(r"\s+", " ", (ROOT / "docs/running.md").read_text())
    for model in SIZES.values():
        full = [
            e.name
            for e in registry.discover().values()
            if e.model == model and e.meta.task == "sft" and e.tree == "bridge_recipes"
        ]
        for name in full:
            cfg = registry.load(name)()
            assert disk.amount(disk.checkpoint_bytes(cfg, model_dims(cfg.model)) / 1e9) in text, name


def test_the_toy_dry_run_prints_the_disk_it_writes(tmp_path):
    """The lora page's toy: a released-form folder, a text recipe, a LoRA run with an export."""
    toy = tmp_path / "toy"
    make_toy(toy, "moe", vl=True, mtp_num_layers=1, tokenizer_json=TEMPLATE / "tokenizer.json")
    rows = tmp_path / "rows"
    build_sft_rows(ROOT / "examples/conversations.jsonl", toy, rows, row_tokens=512, progress=False)
    argv = ["--recipe", "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config", "--hf-checkpoint", toy, "--scale-down", 4]
    argv += ["--dataset", "sft-rows", f"dataset.path={rows}", "-sl", 512, "-gb", 8, "--save-dir", tmp_path / "ckpt"]
    argv += ["--export-hf", tmp_path / "export", "--dry-run", "--max-steps", 250, "--save-interval", 100]
    env = {**os.environ, "QWEN35_RECIPES_CACHE": str(tmp_path / "cache")}
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts/run_recipe.py"), *map(str, argv)], capture_output=True, text=True, env=env
    )
    assert p.returncode == 0, p.stderr[-2000:]
    (line,) = re.findall(r"^disk {14}(.*)$", p.stdout, re.M)
    shards = sum(f.stat().st_size for f in toy.glob("*.safetensors"))
    merged = float(re.search(r"exports ([\d.]+) MB merged", line).group(1))
    assert merged == pytest.approx(shards / 1e6, rel=0.01)  # the whole toy, vision tower included
    assert re.match(r"about [\d.]+ MB: 3 checkpoint\(s\) x [\d.]+ MB \(adapters \+ optimizer state, all kept\)", line)
    assert "conversion cache" in line


def test_the_rows_per_step_and_learning_rate_on_the_lora_page_are_the_recipes():
    from bridge_recipes.config.builder import build
    from bridge_recipes.config.datasets import row_tokens, rows_per_step

    text = (ROOT / "docs/lora.md").read_text().split("## Rows per step", 1)[1].split("\n## ", 1)[0]
    settings = set()
    for model in SIZES.values():
        for name in lora_recipes(model):
            cfg = build(name, dataset="sft-rows")
            o, s = cfg.optimizer, cfg.scheduler
            assert rows_per_step(cfg) == 128 and row_tokens(cfg) in (8192, 32768), name
            assert (row_tokens(cfg) == 32768) == name.endswith("_32k_config")
            settings.add(
                (o.lr, o.min_lr, s.lr_warmup_iters, s.lr_decay_style, o.adam_beta2, o.weight_decay, o.clip_grad)
            )
            assert cfg.train.train_iters == 50 and s.lr_decay_iters is None  # decays to min_lr at the last step
    ((lr, min_lr, warmup, decay, beta2, wd, clip),) = settings
    assert (lr, min_lr, warmup, decay, beta2, wd, clip) == (1e-4, 1e-5, 5, "cosine", 0.98, 0.1, 1.0)
    sci = lambda x: f"{x:.0e}".replace("e-0", "e-")  # noqa: E731  (1e-4, as the page writes it)
    assert (
        f"learning rate {sci(lr)}" in text and f"{warmup} warm-up steps" in text and f"decay to {sci(min_lr)}" in text
    )
    assert f"beta2 {beta2:g}" in text and f"weight decay {wd:g}" in text and f"norm {clip:g}" in text
    for rows, steps, small in (
        r for r in doc_table("lora.md", "Rows per step, steps per epoch and the learning rate")
    ):
        n = int(rows.replace(",", ""))
        assert (int(steps.replace(",", "")), int(small.replace(",", ""))) == (n // 128, n // 32)
    lr_rows = re.findall(r"^\| (\d+) \| (\d+) \| ([\d.e-]+) \| ([\d.e-]+) \|$", text, re.M)
    assert [int(gb) for gb, *_ in lr_rows] == [128, 64, 32, 16]
    for gb, rows, root, linear in lr_rows:
        assert int(rows) == int(gb)
        assert float(root) == pytest.approx(lr * (int(gb) / 128) ** 0.5, rel=5e-3)
        assert float(linear) == pytest.approx(lr * int(gb) / 128)
