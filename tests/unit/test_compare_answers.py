"""scripts/compare_answers.py: a fine-tune's answers beside the base model's, on a CPU with a toy.

The fine-tune is the two folders an export writes, from the adapter and merged streams Megatron-Bridge
produced on a GPU (the ``lora_streams`` fixture); the prompts come from a rows folder's
validation split, a conversations file, or text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge_recipes.evaluate import answers
from bridge_recipes.hf import released

ROOT = Path(__file__).resolve().parents[2]
CONVERSATIONS = ROOT / "examples" / "conversations.jsonl"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, lora_streams):
    """A released-form MoE toy, its merged export and adapter folder, and rows with a validation split."""
    from bridge_recipes.data.sft_rows import build_sft_rows

    root = tmp_path_factory.mktemp("answers")
    case = lora_streams.case("moe")
    toy = lora_streams.make_toy(case, root / "toy")
    lora_streams.write_exports(case, toy, root / "export", seed=5)
    build_sft_rows(CONVERSATIONS, toy, root / "rows", row_tokens=512, val_fraction=0.25, progress=False)
    return toy, root / "export", root


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = answers.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_adapter_and_the_merged_export_answer_the_validation_prompts_alike(tuned, tmp_path, capsys):
    toy, export, root = tuned
    common = ["--base", str(toy), "--rows", str(root / "rows"), "--first", "2", "--max-new-tokens", "6"]
    common += ["--device", "cpu"]
    rc, shown, _ = run(
        [*common, "--adapter", str(released.adapter_folder(export)), "--out", str(tmp_path / "a")], capsys
    )
    assert rc == 0 and shown.count("=== prompt") == 2 and "--- reference" in shown
    rc, _, _ = run([*common, "--export", str(export), "--out", str(tmp_path / "m")], capsys)
    assert rc == 0
    a, m = ([json.loads(line) for line in (tmp_path / f).read_text().splitlines()] for f in ("a", "m"))
    assert len(a) == len(m) == 2 and all(r["reference"] for r in a)
    assert all(r["shown"].strip() and "<|im_start|>" not in r["shown"] for r in a)  # the user's own words
    assert [r["answers"]["fine-tuned"] for r in a] == [r["answers"]["fine-tuned"] for r in m]  # one model
    assert [r["answers"]["base"] for r in a] == [r["answers"]["base"] for r in m]
    assert any(r["answers"]["base"] != r["answers"]["fine-tuned"] for r in a)  # the adapters answer otherwise


def test_prompts_come_from_text_or_conversation_records(tuned, tmp_path, capsys):
    toy, export, _ = tuned
    common = ["--base", str(toy), "--export", str(export), "--max-new-tokens", "3", "--device", "cpu"]
    rc, shown, _ = run([*common, "--prompt", "hello there", "--prompt", "the quick fox"], capsys)
    assert rc == 0 and shown.count("=== prompt") == 2 and "hello there" in shown and "--- reference" not in shown
    rc, shown, _ = run([*common, "--prompts", str(CONVERSATIONS), "--first", "1"], capsys)
    first = json.loads(CONVERSATIONS.read_text().splitlines()[0])
    reply = next(m["content"] for m in first["messages"] if m["role"] == "assistant")
    assert rc == 0 and shown.count("=== prompt") == 1 and reply.strip()[:40] in shown


def test_bad_input_is_refused_before_any_model_loads(tuned, tmp_path, capsys):
    toy, export, _ = tuned
    taken = tmp_path / "taken.jsonl"
    taken.write_text("mine\n")
    cases = [
        (["--adapter", str(export)], "adapter_config.json"),  # the merged folder given as the adapter
        (["--export", str(tmp_path / "missing")], "no such folder"),
        (["--export", str(export), "--out", str(taken)], "never written over"),
    ]
    for extra, words in cases:
        rc, _, err = run(["--base", str(toy), *extra, "--prompt", "hi", "--device", "cpu"], capsys)
        assert rc == 2 and words in err and "Traceback" not in err, err
    assert taken.read_text() == "mine\n"
