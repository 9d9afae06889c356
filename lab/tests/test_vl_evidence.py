"""The CPU-checkable parts of the VL fine-tuning evidence (lab.vl_evidence): the
GPU run's command passes the dry run, the held-out loss scores what training supervises and
falls when a model learns, and the gates see each failure."""

import contextlib
import copy
import io
from pathlib import Path

import pytest

from bridge_recipes.vl.synthetic_images import held_out_examples, write_conversations
from lab import vl_evidence

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tiny_vl_toy):
    return tiny_vl_toy[0]


def test_the_gpu_runs_command_passes_the_dry_run(tmp_path):
    """The evidence's toy (its default sizes) and a shapes dataset built with it: the training
    command of the GPU test, dry-run here."""
    from bridge_recipes.hf.toy import make_toy, toy_spec
    from bridge_recipes.runner.cli import main as run_main
    from bridge_recipes.vl.vl_dataset import build_vl_dataset

    toy = tmp_path / "toy"
    make_toy(toy, "moe", vl=True)
    src = write_conversations(tmp_path / "data", 40, seed=0)
    build_vl_dataset(src, toy, tmp_path / "ds", val_fraction=vl_evidence.VAL_FRACTION, progress=False)
    args = vl_evidence.run_args(toy, toy_spec("moe", vl=True), tmp_path / "ds", tmp_path / "export", tmp_path / "ck")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = run_main(["--recipe", vl_evidence.RECIPE, *args, "--dry-run"])
    assert rc == 0, out.getvalue()[-3000:]
    assert "[run_recipe] error" not in out.getvalue()


def test_the_held_out_loss_scores_the_reply_and_falls_as_a_model_learns(tiny, tmp_path):
    import torch
    from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn
    from transformers import AutoModelForImageTextToText, AutoProcessor

    pixels = vl_evidence.PIXELS
    held_out = held_out_examples(6)
    before = vl_evidence.held_out_loss(tiny, tiny, held_out, **pixels)
    processor = AutoProcessor.from_pretrained(str(tiny), local_files_only=True)
    replies = [ex["conversation"][1]["content"][0]["text"] for ex in held_out]
    # the reply, its <|im_end|> and the newline after it: the tokens training supervises
    want = sum(len(processor.tokenizer(r + "<|im_end|>\n")["input_ids"]) for r in replies)
    assert before["tokens"] == want and before["examples"] == 6 and len(before["per_example"]) == 6

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(str(tiny), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = held_out_examples(32, seed=1)
    for step in range(8):
        batch = qwen2_5_collate_fn(
            [{"conversation": ex["conversation"]} for ex in train[4 * step : 4 * step + 4]],
            processor,
            require_assistant_matches=True,
            **pixels,
        )
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            mm_token_type_ids=batch["mm_token_type_ids"],
            pixel_values=batch["visual_inputs"].pixel_values,
            image_grid_thw=batch["visual_inputs"].image_grid_thw,
        ).logits
        mask = batch["loss_mask"].bool()
        loss = torch.nn.functional.cross_entropy(logits[mask], batch["labels"][mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = tmp_path / "trained"
    model.save_pretrained(str(trained))
    after = vl_evidence.held_out_loss(trained, tiny, held_out, **pixels)
    assert after["tokens"] == before["tokens"] and after["loss"] < 0.8 * before["loss"]


def test_swapped_images_keep_the_text_and_show_another_answer():
    examples = held_out_examples(12)
    swapped = vl_evidence.swapped_images(examples)
    for ex, sw in zip(examples, swapped):
        (image,) = [p["image"] for p in sw["conversation"][0]["content"] if p["type"] == "image"]
        source = next(e for e in examples if e["conversation"][0]["content"][0]["image"] is image)
        assert (source["colour"], source["shape"]) != (ex["colour"], ex["shape"])
        texts = [[p for p in t["content"] if p["type"] == "text"] for t in sw["conversation"]]
        assert texts == [[p for p in t["content"] if p["type"] == "text"] for t in ex["conversation"]]


def _passing_summary() -> dict:
    losses = {s: 6.0 - 0.15 * s for s in range(1, 31)}
    return {
        "training": {
            "returncode": 0,
            "steps": 30,
            "losses": losses,
            "check": {"passed": True, "reasons": []},
            "validation_losses": {10: 4.1, 20: 3.2, 30: 2.9},
        },
        "held_out": {"toy": {"loss": 6.9}, "export": {"loss": 2.5}},
        "errors": [],
    }


@pytest.mark.parametrize(
    "breakage,named",
    [
        (lambda s: s["training"].update(returncode=1), "exited 1"),
        (lambda s: s["training"].update(steps=4), "after 4 step(s)"),
        (lambda s: s["training"]["check"].update(passed=False, reasons=["flat"]), "did not fall"),
        (lambda s: s["training"].update(validation_losses={}), "validation"),
        (lambda s: s["held_out"].pop("export"), "missing"),
        (lambda s: s["held_out"]["export"].update(loss=7.0), "not below"),
        (lambda s: s["errors"].append("boom"), "boom"),
    ],
)
def test_the_gates_see_each_failure(breakage, named):
    assert vl_evidence.failures(_passing_summary()) == []
    broken = copy.deepcopy(_passing_summary())
    breakage(broken)
    found = vl_evidence.failures(broken)
    assert found and any(named in f for f in found), found


def test_validation_losses_are_read_per_step_the_last_line_winning():
    from bridge_recipes.logs.megatron_log import validation_losses

    text = (ROOT / "lab/evidence/sft_real_format/sft_real_format_qwen35_27b.log").read_text()
    lines = [line for line in text.splitlines() if "validation loss at iteration" in line]
    found = validation_losses(text)
    assert lines and sorted(found) == sorted({int(line.split("iteration")[1].split()[0]) for line in lines})
    last = lines[-1]
    step = int(last.split("iteration")[1].split()[0])
    assert f"{found[step]:.6E}" in last
    assert validation_losses("iteration 3/ 10 | lm loss: 1.0 |\n") == {}
