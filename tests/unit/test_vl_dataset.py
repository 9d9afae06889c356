"""scripts/build_vl_dataset.py: image conversations in each accepted form into the Energon dataset
Megatron-Bridge's Qwen-VL task encoder reads, bad conversations skipped by reason, atomically."""

import base64
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bridge_recipes.chat.conversations import MalformedConversation
from bridge_recipes.vl import vl_dataset, vl_samples
from bridge_recipes.vl.synthetic_images import QUESTION, answer, draw, write_conversations
from bridge_recipes.vl.vl_conversations import load_image, parse_record

ROOT = Path(__file__).resolve().parents[2]
TEXT_TOKENIZER = ROOT / "tests/fixtures/qwen35_chat_tokenizer"
GOOD = 24  # conversations written by write_conversations


def _png(rng_seed=0, colour="red", shape="square") -> bytes:
    import random

    out = io.BytesIO()
    draw(colour, shape, random.Random(rng_seed)).save(out, "PNG")
    return out.getvalue()


def _user_image(part: dict, text: str = QUESTION) -> dict:
    return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": text}]}, _reply()]}


def _reply(text: str = "a red square") -> dict:
    return {"role": "assistant", "content": text}


@pytest.fixture(scope="module")
def toy(tiny_vl_toy):
    return tiny_vl_toy[0]


# One bad record of each kind, with the reason it is skipped under.
BAD = {
    "missing image": (_user_image({"type": "image", "image": "images/nowhere.png"}), "image_missing"),
    "unreadable image": (_user_image({"type": "image", "image": "not_an_image.png"}), "image_unreadable"),
    "oversized image": (_user_image({"type": "image", "image": "big.png"}), "image_oversized"),
    "elongated image": (_user_image({"type": "image", "image": "thin.png"}), "image_aspect_ratio"),
    "remote image": (_user_image({"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}), "image_remote"),
    "two placeholders, one image": (
        {"messages": [{"role": "user", "content": "<image><image> what?"}, _reply()], "images": ["big.png"]},
        "image_count_mismatch",
    ),
    "no assistant": ({"messages": [{"role": "user", "content": "hi"}]}, "no_assistant_turn"),
    "unknown role": ({"messages": [{"role": "robot", "content": "hi"}, _reply()]}, "unknown_role"),
    "video part": (_user_image({"type": "video", "video": "a.mp4"}), "unsupported_part"),
    "vision token as text": (
        {"messages": [{"role": "user", "content": "<|image_pad|> hi"}, _reply()]},
        "vision_token_in_text",
    ),
    "empty reply": (
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": ""}]},
            ]
        },
        "empty_assistant_reply",
    ),
}
MAX_IMAGE_BYTES = 20_000


def _source(folder: Path) -> Path:
    """GOOD shape conversations, one text-only one, every BAD record, a blank line and a broken line."""
    from PIL import Image

    src = write_conversations(folder, GOOD, seed=3)
    (folder / "not_an_image.png").write_text("these are not pixels")
    Image.new("RGB", (400, 400), (1, 2, 3)).save(folder / "big.png", "BMP")  # 480 kB, over MAX_IMAGE_BYTES
    Image.new("RGB", (402, 2), "red").save(folder / "thin.png")
    lines = src.read_text().splitlines()
    lines.append(json.dumps({"messages": [{"role": "user", "content": "no image here"}, _reply("fine")]}))
    lines += [json.dumps(record) for record, _ in BAD.values()]
    lines += ["", "{broken"]
    src.write_text("\n".join(lines) + "\n")
    return src


@pytest.fixture(scope="module")
def built(toy, tmp_path_factory):
    root = tmp_path_factory.mktemp("vl")
    src = _source(root / "data")
    out = root / "dataset"
    manifest = vl_dataset.build_vl_dataset(
        src, toy, out, val_fraction=0.2, samples_per_shard=7, max_image_bytes=MAX_IMAGE_BYTES, progress=False
    )
    return src, out, manifest


def test_the_vl_toy_ships_its_processor_with_matching_token_ids(toy):
    from transformers import AutoProcessor

    config = json.loads((toy / "config.json").read_text())
    processor = AutoProcessor.from_pretrained(str(toy), local_files_only=True)
    assert config["image_token_id"] == processor.image_token_id
    assert config["vision_start_token_id"] == processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert config["vision_config"]["patch_size"] == processor.image_processor.patch_size


def test_every_accepted_form_gives_the_same_conversation(tmp_path):
    (tmp_path / "img").mkdir()
    png = tmp_path / "img" / "a.png"
    png.write_bytes(_png())
    data_url = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    forms = [
        _user_image({"type": "image_url", "image_url": {"url": png.resolve().as_uri()}}),
        _user_image({"type": "image_url", "image_url": "img/a.png"}),
        _user_image({"type": "image", "image": "img/a.png"}),
        _user_image({"type": "image", "image": str(png)}),
        _user_image({"type": "image_url", "image_url": {"url": data_url}}),
        {
            "conversations": [
                {"from": "human", "value": f"<image>{QUESTION}"},
                {"from": "gpt", "value": "a red square"},
            ],
            "images": ["img/a.png"],
        },
        {"messages": [{"role": "user", "content": f"<image>{QUESTION}"}, _reply()], "image": "img/a.png"},
    ]
    want = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a red square"}]},
    ]
    limits = dict(max_bytes=10**6, max_pixels=10**6)
    for i, record in enumerate(forms):
        conversation = parse_record(record, i, tmp_path)
        assert conversation.messages == want, record
        [ref] = conversation.images
        assert load_image(ref, i, **limits).data == png.read_bytes(), record


def test_bad_conversations_are_skipped_and_counted_by_reason(built):
    _, _, manifest = built
    c = manifest["conversations"]
    want = {reason: 1 for _, reason in BAD.values()} | {"invalid_json": 1}
    assert c["skipped"] == want
    assert c["used"] == GOOD + 1 and c["text_only"] == 1 and c["blank_lines"] == 1
    assert c["read"] == c["used"] + c["skipped_total"] == c["indexed"]


def test_the_validation_split_is_the_head_of_the_seeded_permutation(built):
    src, out, manifest = built
    indexed = manifest["conversations"]["indexed"]
    order = np.random.default_rng(vl_dataset.DEFAULT_SEED).permutation(indexed)
    head = set(order[: math.ceil(0.2 * indexed)].tolist())
    samples = pq.read_table(out / vl_dataset.SAMPLES_FILE).to_pylist()
    assert {s["source_row"] for s in samples if s["split"] == "val"} <= head
    assert not {s["source_row"] for s in samples if s["split"] == "train"} & head
    for split, info in manifest["splits"].items():
        assert (
            info["samples"] == sum(s["split"] == split for s in samples) == sum(x["samples"] for x in info["shards"])
        )
        assert all(x["samples"] <= 7 for x in info["shards"])


def test_manifest_pins_the_files(built, toy):
    _, out, manifest = built
    from bridge_recipes.utils.outputs import file_sha256

    for info in manifest["splits"].values():
        for shard in info["shards"]:
            assert file_sha256(out / shard["file"]) == shard["sha256"]
    assert file_sha256(out / vl_dataset.SAMPLES_FILE) == manifest["samples_sha256"]
    assert manifest["processor"]["files"]["tokenizer.json"] == file_sha256(toy / "tokenizer.json")
    assert manifest["source_sha256"] == file_sha256(manifest["source"])


def _energon_samples(out: Path, toy: Path, split: str, **pixels) -> dict[str, dict]:
    """Each sample of ``split`` as Megatron-Bridge's Energon path gives it to training, by key."""
    from megatron.bridge.data.builders.energon import (
        EnergonDatasetConfig,
        QwenVLEnergonTaskEncoderConfig,
        build_energon_task_encoder,
    )
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    encoder = QwenVLEnergonTaskEncoderConfig(hf_processor_path=str(toy), patch_size=16, **pixels)
    cfg = EnergonDatasetConfig(path=str(out), seq_length=4096, micro_batch_size=1, task_encoder=encoder)
    task_encoder = build_energon_task_encoder(cfg)
    workers = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        str(out),
        batch_size=1,
        task_encoder=task_encoder,
        worker_config=workers,
        split_part=split,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        repeat=False,
    )
    tokenizer = task_encoder.image_processor.tokenizer
    out_samples = {}
    for batch in get_savable_loader(ds, worker_config=workers):
        mask = batch["loss_mask"][0].bool()
        out_samples[batch["__keys__"][0]] = {
            "tokens": int(batch["attention_mask"][0].sum()),
            "target": tokenizer.decode(batch["labels"][0][mask]),
            "image_tokens": int((batch["input_ids"][0] == task_encoder.image_processor.image_token_id).sum()),
        }
    return out_samples


@pytest.mark.parametrize("pixels", [dict(min_pixels=3136, max_pixels=16384), dict(min_pixels=200704)])
def test_megatron_bridge_reads_every_sample_as_the_manifest_measures_it(built, toy, pixels):
    """Both splits load through Megatron-Bridge's Energon data path with the Qwen-VL task encoder; each
    sample's length and image tokens are what ``sequence_tokens`` predicts from samples.parquet, and its
    supervised tokens are the reply."""
    src, out, manifest = built
    table = pq.read_table(out / vl_dataset.SAMPLES_FILE)
    budget = dict(patch=16, merge=2, min_pixels=pixels["min_pixels"], max_pixels=pixels.get("max_pixels", 1003520))
    predicted = dict(zip(table.column("key").to_pylist(), vl_samples.sequence_tokens(table, **budget).tolist()))
    images = dict(zip(table.column("key").to_pylist(), vl_samples.visual_tokens(table, **budget).tolist()))
    replies = {}
    for i, line in enumerate(Path(src).read_text().splitlines()):
        record = json.loads(line) if line.startswith('{"') else None
        if record and "messages" in record:
            reply = record["messages"][-1]["content"]
            replies[f"{i:09d}"] = reply if isinstance(reply, str) else None
        elif record and "conversations" in record:
            replies[f"{i:09d}"] = record["conversations"][-1]["value"]
    seen = {}
    for split in ("train", "val"):
        got = _energon_samples(out, toy, split, **pixels)
        assert len(got) == manifest["splits"][split]["samples"]
        seen |= got
    assert {k: v["tokens"] for k, v in seen.items()} == {k: predicted[k] for k in seen}
    assert {k: v["image_tokens"] for k, v in seen.items()} == {k: images[k] for k in seen}
    # the collate supervises the reply, its <|im_end|> and the newline the template writes after it
    assert {k: v["target"] for k, v in seen.items()} == {k: replies[k] + "<|im_end|>\n" for k in seen}


def test_image_tokens_follow_the_collates_two_resizes(toy):
    """``image_tokens`` against qwen-vl-utils' fetch_image and the processor's grid, on awkward sizes."""
    from PIL import Image
    from qwen_vl_utils import fetch_image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(toy), local_files_only=True)
    rng = np.random.default_rng(0)
    sizes = [(1, 150), (27, 29), (3000, 2000), *rng.integers(8, 1500, size=(12, 2)).tolist()]
    for min_pixels, max_pixels in ((3136, 1003520), (200704, 1003520), (1024, 8192)):
        for h, w in sizes:
            image = fetch_image({"image": Image.new("RGB", (w, h))})
            grid = processor.image_processor(
                images=[image], min_pixels=min_pixels, max_pixels=max_pixels, return_tensors="pt"
            )["image_grid_thw"]
            want = int(grid.prod()) // 4
            got = vl_samples.image_tokens(h, w, patch=16, merge=2, min_pixels=min_pixels, max_pixels=max_pixels)
            assert got == want, (h, w, min_pixels, max_pixels)


def test_a_build_is_reproducible_and_moves_whole(built, toy, tmp_path):
    src, out, manifest = built
    again = vl_dataset.build_vl_dataset(
        src, toy, tmp_path / "a" / "b", val_fraction=0.2, samples_per_shard=7, max_image_bytes=MAX_IMAGE_BYTES,
        progress=False,
    )  # fmt: skip
    assert again["splits"] == manifest["splits"] and again["samples_sha256"] == manifest["samples_sha256"]
    moved = tmp_path / "moved"
    (tmp_path / "a" / "b").rename(moved)
    assert len(_energon_samples(moved, toy, "val", min_pixels=3136)) == manifest["splits"]["val"]["samples"]


def test_a_failed_build_leaves_the_old_dataset_and_no_staging(built, toy, tmp_path, monkeypatch):
    src, _, _ = built
    out = tmp_path / "ds"
    first = vl_dataset.build_vl_dataset(src, toy, out, progress=False, max_image_bytes=MAX_IMAGE_BYTES)
    before = sorted(p.name for p in out.iterdir())

    def fail(folder, splits):
        raise RuntimeError("indexing failed")

    monkeypatch.setattr(vl_dataset, "_prepare_energon", fail)
    with pytest.raises(RuntimeError):
        vl_dataset.build_vl_dataset(src, toy, out, overwrite=True, val_fraction=0.5, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    assert sorted(p.name for p in out.iterdir()) == before
    assert json.loads((out / "manifest.json").read_text())["splits"] == first["splits"]


def _script(*args):
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts/build_vl_dataset.py"), *map(str, args), "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )


def test_the_script_builds_and_summarises(built, toy, tmp_path):
    src, _, manifest = built
    p = _script("--input", src, "--processor", toy, "--out", tmp_path / "ds", "--val-fraction", "0.2",
                "--samples-per-shard", "7", "--max-image-bytes", MAX_IMAGE_BYTES)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"dataset.path={tmp_path / 'ds'}" in p.stdout
    for reason in manifest["conversations"]["skipped"]:
        assert reason in p.stdout
    assert json.loads((tmp_path / "ds" / "manifest.json").read_text())["splits"] == manifest["splits"]


@pytest.mark.parametrize(
    "case,flag",
    [
        ("missing input", "--input"),
        ("not jsonl", "--input"),
        ("processor is not a folder", "--processor"),
        ("text-only processor", "--processor"),
        ("out holds the input", "--input"),
        ("out not empty", "--overwrite"),
        ("out holds other files", "did not write"),
        ("val fraction", "--val-fraction"),
        ("no usable conversation", "no training samples"),
    ],
)
def test_bad_input_is_refused_naming_the_flag(built, toy, tmp_path, capsys, case, flag):
    from bridge_recipes.vl.vl_cli import main

    src, out, _ = built
    args = {"--input": src, "--processor": toy, "--out": tmp_path / "new"}
    if case == "missing input":
        args["--input"] = tmp_path / "nothing.jsonl"
    elif case == "not jsonl":
        args["--input"] = tmp_path / "c.json"
        args["--input"].write_text("{}")
    elif case == "processor is not a folder":
        args["--processor"] = src
    elif case == "text-only processor":
        args["--processor"] = TEXT_TOKENIZER
    elif case == "out holds the input":
        args["--out"] = src.parent
    elif case == "out not empty":
        args["--out"] = out
    elif case == "out holds other files":
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("mine")
        args["--out"] = tmp_path / "mine"
    elif case == "no usable conversation":
        args["--input"] = tmp_path / "bad.jsonl"
        args["--input"].write_text("{broken\n")
    extra = ["--val-fraction", "1.0"] if case == "val fraction" else []
    extra += ["--overwrite"] if case == "out holds other files" else []
    before = {p: p.read_bytes() for p in src.parent.rglob("*") if p.is_file()}
    assert main([str(x) for kv in args.items() for x in kv] + extra + ["--no-progress"]) == 2
    assert flag in capsys.readouterr().err
    assert {p: p.read_bytes() for p in src.parent.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "new").exists()


def test_the_script_fails_with_a_message_not_a_traceback(built, tmp_path):
    src, out, _ = built
    p = _script("--input", src, "--processor", tmp_path / "missing", "--out", tmp_path / "new")
    assert p.returncode == 2 and "--processor" in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "new").exists()


def test_a_conversation_over_the_image_limits_is_skipped_before_it_is_decoded(tmp_path):
    from PIL import Image

    big = tmp_path / "big.png"
    Image.new("RGB", (300, 300)).save(big)
    ref = parse_record(_user_image({"type": "image", "image": "big.png"}), 0, tmp_path).images[0]
    with pytest.raises(MalformedConversation) as e:
        load_image(ref, 0, max_bytes=10**9, max_pixels=300 * 299)
    assert e.value.reason == "image_oversized"
    assert load_image(ref, 0, max_bytes=10**9, max_pixels=300 * 300).width == 300


def test_the_generated_answers_name_what_the_image_shows(tmp_path):
    """Every written record's reply names the colour and shape drawn: the colour's pixels are in the
    image, and the shape covers about its expected share of its bounding box."""
    from PIL import Image

    from bridge_recipes.vl.synthetic_images import COLOURS, FORMS, SHAPES

    src = write_conversations(tmp_path, 12, seed=5)
    share = {"square": 1.0, "circle": math.pi / 4, "triangle": 0.5}
    for i, line in enumerate(src.read_text().splitlines()):
        record = json.loads(line)
        turns = record.get("messages") or record["conversations"]
        reply = turns[-1].get("content") or turns[-1].get("value")
        colour, shape = reply.split()[1:]
        assert colour in COLOURS and shape in SHAPES and reply == answer(colour, shape)
        assert ("conversations" in record) == (FORMS[i % len(FORMS)] == "llava")
        pixels = np.asarray(Image.open(tmp_path / "images" / f"{i:06d}.png"))
        ys, xs = np.nonzero((pixels == COLOURS[colour]).all(axis=-1))
        box = (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)
        assert abs(len(ys) / box - share[shape]) < 0.12, (reply, len(ys) / box)
