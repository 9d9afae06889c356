"""The packed-against-one-per-row comparison's rows: built by the default builder, each boundaries row
holds exactly the three conversations of three consecutive one_per_row rows, in the training and the
validation split, so a step of 4 packed rows and a step of 12 one-per-row rows train on the same
conversations; the check finds rows that are not (the evidence conversations, whose lengths vary)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from bridge_recipes.data.inspect_rows import row_conversations
from bridge_recipes.data.integrity import VAL_DIR, check_rows
from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.data.synthetic_chat import (
    ALIGNED_PER_ROW,
    ALIGNED_TOKENS,
    EVIDENCE_ROW_TOKENS,
    EVIDENCE_VAL_FRACTION,
    aligned_row_problems,
    build_aligned_rows,
    conversations_jsonl,
)

TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer"
PACKINGS = ("boundaries", "one_per_row")
STEPS, ONE_PER_ROW_BATCH = 10, 12  # what the GPU comparison trains


@pytest.fixture(scope="module")
def aligned(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("aligned")
    for packing in PACKINGS:
        build_aligned_rows(root / packing, TOKENIZER, packing)
    return root


def test_each_packed_row_is_three_consecutive_one_per_row_rows(aligned):
    assert aligned_row_problems(aligned / "boundaries", aligned / "one_per_row") == []
    single = check_rows(aligned / "one_per_row")
    assert len(single.ids) >= STEPS * ONE_PER_ROW_BATCH
    assert len(check_rows(aligned / "one_per_row" / VAL_DIR).ids) >= ALIGNED_PER_ROW


def test_every_conversation_has_the_length_that_fits_three_a_row(aligned):
    assert ALIGNED_PER_ROW * ALIGNED_TOKENS <= EVIDENCE_ROW_TOKENS < (ALIGNED_PER_ROW + 1) * ALIGNED_TOKENS
    for sub in ("", VAL_DIR):
        rows = check_rows(aligned / "one_per_row" / sub)
        eos = rows.manifest["eos_token_id"]
        lengths = {
            len(c[0])
            for ids, mask in zip(rows.ids, rows.mask)
            for c in row_conversations(ids, mask, None, "one_per_row", eos)
        }
        assert lengths == {ALIGNED_TOKENS}
        assert rows.manifest["conversations"]["skipped_total"] == 0


def test_the_check_finds_the_evidence_rows_out_of_step(tmp_path):
    """The evidence conversations vary in length: their packed rows hold 2 to 4 conversations and
    close out of order, so packed row i is not one_per_row rows 3i .. 3i+2."""
    src = tmp_path / "chat.jsonl"
    src.write_text(conversations_jsonl(90, seed=0))
    for packing in PACKINGS:
        build_sft_rows(
            src,
            TOKENIZER,
            tmp_path / packing,
            row_tokens=EVIDENCE_ROW_TOKENS,
            val_fraction=EVIDENCE_VAL_FRACTION,
            packing=packing,
            progress=False,
        )
    problems = aligned_row_problems(tmp_path / "boundaries", tmp_path / "one_per_row")
    assert any(re.match(r"train row \d+: conversation \d+ .*one_per_row row \d+", p) for p in problems)


def test_a_rows_conversations_are_its_segments_without_the_padding():
    eos = 9
    ids = np.array([1, 2, 3, 4, 5, 9, 9, 9])
    mask = np.array([0, 1, 1, 0, 1, 0, 0, 0])
    got = row_conversations(ids, mask, np.array([0, 3, 5, 8]), "boundaries", eos)
    assert [c[0].tolist() for c in got] == [[1, 2, 3], [4, 5]]
    assert [c[1].tolist() for c in got] == [[0, 1, 1], [0, 1]]
    full = row_conversations(ids[:5], mask[:5], np.array([0, 3, 5]), "boundaries", eos)
    assert [c[0].tolist() for c in full] == [[1, 2, 3], [4, 5]]
    alone = row_conversations(ids, mask, None, "one_per_row", eos)
    assert [c[0].tolist() for c in alone] == [[1, 2, 3, 4, 5]]
    with pytest.raises(ValueError, match="eos_joined"):
        row_conversations(ids, mask, None, "eos_joined", eos)
