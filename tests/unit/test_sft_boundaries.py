"""Boundaries rows: whole conversations with cu_seqlens, and the packed-sequence keys the dataset returns;
one_per_row rows: one conversation per padded row, on the standard path."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bridge_recipes.chat.chat_template import TemplateRenderer
from bridge_recipes.data.packed_rows import PackedRowsDataset, PackedSFTRowsConfig, dry_run_problems
from bridge_recipes.data.packing import BoundaryPacker
from bridge_recipes.data.sft_rows import build_sft_rows

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
ROW = 128


def conversation(i: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"What is the weather in Paris on day {i}?"},
            {"role": "assistant", "content": "It is sunny " * (1 + i % 5), "reasoning_content": "think " * (i % 3)},
        ]
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[dict], dict]:
    tmp = tmp_path_factory.mktemp("rows")
    convs = [conversation(i) for i in range(40)]
    convs.append({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "long " * 200}]})
    src = tmp / "c.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in convs))
    m = build_sft_rows(
        src, TOKENIZER, tmp / "out", row_tokens=ROW, packing="boundaries", progress=False, max_dropped_share=1.0
    )
    return tmp / "out", convs, m


def rendered_ids(convs: list[dict]) -> set[tuple[int, ...]]:
    """The token ids of each conversation rendered alone with the fixture's chat template."""
    r = TemplateRenderer(TOKENIZER)
    return {tuple(r.render(c["messages"])[0].tolist()) for c in convs}


def test_packer_places_whole_conversations_and_pads_the_rest():
    p = BoundaryPacker(row_tokens=10, pad_id=0, open_rows=2)
    assert p.add(np.arange(1, 7), np.ones(6)) == []  # row A: 6
    assert p.add(np.arange(1, 6), np.ones(5)) == []  # does not fit A: row B: 5
    assert p.add(np.arange(1, 4), np.ones(3)) == []  # first fit: A (9)
    closed = p.add(np.arange(1, 9), np.ones(8))  # fits neither; 2 open: the fullest (A) closes
    assert len(closed) == 1 and closed[0].cu.tolist() == [0, 6, 9, 10] and closed[0].padding == 1
    assert closed[0].ids.tolist() == [1, 2, 3, 4, 5, 6, 1, 2, 3, 0] and closed[0].mask.tolist()[-1] == 0
    rest = p.finish()
    assert [r.cu.tolist() for r in rest] == [[0, 5, 10], [0, 8, 10]]
    assert p.padding_tokens == 1 + 5 + 2 and p.stream_tokens == 22 and p.conversations == 4


def test_each_row_segment_is_one_whole_conversation(built):
    out, convs, m = built
    rendered = rendered_ids(convs[:40])
    table = pq.read_table(out / "rows.parquet")
    segments = 0
    for ids, mask, cu in zip(*(table.column(k).to_pylist() for k in ("input_ids", "loss_mask", "cu_seqlens"))):
        assert cu[0] == 0 and cu[-1] == ROW and len(ids) == ROW
        for a, b in zip(cu[:-1], cu[1:]):
            if tuple(ids[a:b]) in rendered:
                segments += 1
            else:  # the padding segment: EOS ids, no loss
                assert b == ROW and set(ids[a:b]) == {m["eos_token_id"]} and not any(mask[a:b])
    assert segments == 40 == m["conversations"]["used"]
    assert m["conversations"]["skipped"] == {"longer_than_row": 1}
    assert m["stream_tokens"] + m["padding_tokens"] == m["rows"] * ROW and m["tail_tokens_dropped"] == 0


def test_rows_hash_covers_the_boundaries(built):
    out, _, m = built
    h = hashlib.sha256()
    table = pq.read_table(out / "rows.parquet")
    for ids, mask, cu in zip(*(table.column(k).to_pylist() for k in ("input_ids", "loss_mask", "cu_seqlens"))):
        h.update(np.array(ids, "<i4").tobytes() + np.array(mask, np.uint8).tobytes() + np.array(cu, "<i4").tobytes())
    assert h.hexdigest() == m["rows_sha256"]


def test_sample_carries_the_packed_sequence_keys(built):
    out, _, _ = built
    ds = PackedRowsDataset(out, ROW, 10)
    s = ds[1]
    cu = ds.cu[1]
    assert s["cu_seqlens_q"].tolist() == cu.tolist() == s["cu_seqlens_kv"].tolist()
    assert int(s["max_seqlen_q"]) == int(np.diff(cu).max())
    for a, b in zip(cu[:-1], cu[1:]):
        assert s["position_ids"][a:b].tolist() == list(range(b - a))  # positions restart
        assert s["loss_mask"][b - 1] == 0  # the last token of a conversation predicts nothing
    ids = ds.ids[1]
    assert s["labels"][:-1].tolist() == ids[1:].tolist()
    trained = s["loss_mask"].numpy().astype(bool)
    assert trained.any() and (s["loss_mask"][:-1].numpy() <= ds.mask[1][1:]).all()


def test_megatron_bridge_turns_a_collated_sample_into_thd_params(built):
    """The same path gpt_step takes: default collate (micro batch 1), then get_packed_seq_params."""
    import torch.utils.data
    from megatron.bridge.training.gpt_step import _packed_metadata_for_forward
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    out, _, _ = built
    ds = PackedRowsDataset(out, ROW, 4)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=1)))
    params = get_packed_seq_params(_packed_metadata_for_forward(batch))
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q.tolist() == ds.cu[0].tolist() == params.cu_seqlens_kv.tolist()
    assert params.max_seqlen_q == int(np.diff(ds.cu[0]).max())


def test_config_reports_offline_packing_only_for_boundaries_rows(built, tmp_path):
    out, _, _ = built
    cfg = PackedSFTRowsConfig(path=str(out), seq_length=ROW)
    assert cfg.enable_offline_packing and cfg.offline_packing_specs.packed_sequence_size == ROW
    joined = PackedSFTRowsConfig(path=str(REPO / "tests/fixtures/eos_joined_rows"), seq_length=8192)
    assert not joined.enable_offline_packing and joined.offline_packing_specs is None
    sample = PackedRowsDataset(REPO / "tests/fixtures/eos_joined_rows", 8192, 1)[0]
    assert "cu_seqlens_q" not in sample and sample["position_ids"].tolist() == list(range(8192))


class _Cfg:
    """The parts of a recipe config the dry-run check reads."""

    def __init__(self, path, mbs=1, cp=1, graphs="none", deterministic=False, iters=1, gbs=1, k=1, seq=None):
        from types import SimpleNamespace as NS

        self.dataset = PackedSFTRowsConfig(path=str(path), seq_length=ROW, rows_per_sample=k)
        self.model = NS(
            seq_length=seq or ROW * k,
            vocab_size=512,
            context_parallel_size=cp,
            cuda_graph_impl=graphs,
            deterministic_mode=deterministic,
        )
        self.train = NS(micro_batch_size=mbs, train_iters=iters, global_batch_size=gbs)
        self.tokenizer = NS(tokenizer_model=None)


def test_dry_run_takes_boundaries_rows_with_no_opt_in(built):
    """Rows with boundaries are the SFT default: the dry run takes them as they are."""
    out, _, _ = built
    assert dry_run_problems(_Cfg(out)) == ([], [])


def _declared(path, mbs, gbs=8, k=1, seq=ROW, declare=None):
    """A config whose recipe declares ``declare`` rows per micro batch (none: no declaration)."""
    from types import SimpleNamespace as NS

    from bridge_recipes.data.packed_rows import RECIPE_ROWS

    cfg = NS(
        dataset=PackedSFTRowsConfig(path=str(path), seq_length=ROW, rows_per_sample=k),
        train=NS(micro_batch_size=mbs, global_batch_size=gbs, train_iters=1),
        model=NS(seq_length=seq),
    )
    if declare is not None:
        setattr(cfg.train, RECIPE_ROWS, declare)
    return cfg


def test_the_rows_a_recipe_declares_become_one_sequence_of_them_joined(built):
    """A recipe's k rows per micro batch on boundaries rows: one packed sequence of the k rows, the same rows
    a step, each change named; the joined config passes the dry run."""
    from bridge_recipes.data.packed_rows import join_recipe_rows

    out, _, _ = built
    cfg = _declared(out, mbs=2, declare=2)
    changes = join_recipe_rows(cfg)
    assert (cfg.train.micro_batch_size, cfg.train.global_batch_size, cfg.model.seq_length) == (1, 4, 2 * ROW)
    assert cfg.dataset.rows_per_sample == 2
    changed = dict(change.split(": ", 1) for change in changes if ": " in change)  # field: old -> new
    assert changed["train.micro_batch_size"] == "2 -> 1" and changed["dataset.rows_per_sample"] == "1 -> 2"
    assert join_recipe_rows(cfg) == []  # once
    assert dry_run_problems(_Cfg(out, k=2))[0] == []
    # other rows keep the recipe's micro batch: rows side by side
    other = _declared(REPO / "tests/fixtures/eos_joined_rows", mbs=2, declare=2, seq=8192)
    other.dataset.seq_length = 8192
    assert join_recipe_rows(other) == [] and other.train.micro_batch_size == 2


def test_a_micro_batch_the_recipe_does_not_declare_is_left_for_the_dry_run_to_refuse(built):
    """train.micro_batch_size is the user's: an undeclared micro batch of 2, or one the overrides moved off the
    recipe's 4, stays as set, and the dry run names the field, its value and the rows-per-sequence fix."""
    from bridge_recipes.data.packed_rows import join_recipe_rows

    out, _, _ = built
    for cfg in (_declared(out, mbs=2), _declared(out, mbs=2, declare=4)):
        assert join_recipe_rows(cfg) == []
        assert (cfg.train.micro_batch_size, cfg.dataset.rows_per_sample, cfg.model.seq_length) == (2, 1, ROW)
    (error,) = dry_run_problems(_Cfg(out, mbs=2, gbs=8))[0]
    assert "train.micro_batch_size 2" in error
    assert "-mb 1 dataset.rows_per_sample=2" in error and f"model.seq_length={2 * ROW}" in error and "-gb 4" in error
    # rows already two per sequence, two such per micro batch: four rows per sequence
    (error,) = dry_run_problems(_Cfg(out, mbs=2, gbs=8, k=2))[0]
    assert "dataset.rows_per_sample=4" in error and f"model.seq_length={4 * ROW}" in error


def test_a_global_batch_that_does_not_split_into_the_recipes_sequences_is_named(built):
    from bridge_recipes.data.packed_rows import RECIPE_ROWS, join_recipe_rows

    out, _, _ = built
    cfg = _declared(out, mbs=2, gbs=7, declare=2)
    assert join_recipe_rows(cfg) == [] and cfg.train.micro_batch_size == 2
    odd = _Cfg(out, mbs=2, gbs=7)
    setattr(odd.train, RECIPE_ROWS, 2)
    (error,) = dry_run_problems(odd)[0]
    assert "train.global_batch_size 7" in error and "multiple of 2" in error


def test_rows_joined_into_one_packed_sequence_on_request(built):
    """dataset.rows_per_sample k: a sample is k consecutive rows joined, their boundaries kept."""
    out, _, _ = built
    one = PackedRowsDataset(out, ROW, 4)
    two = PackedRowsDataset(out, ROW, 2, rows_per_sample=2)
    a, b, joined = one[2], one[3], two[1]
    assert joined["tokens"].tolist() == a["tokens"].tolist() + b["tokens"].tolist()
    cu_a, cu_b = a["cu_seqlens_q"].tolist(), b["cu_seqlens_q"].tolist()
    assert joined["cu_seqlens_q"].tolist() == cu_a + [ROW + c for c in cu_b[1:]]
    assert joined["position_ids"].tolist() == a["position_ids"].tolist() + b["position_ids"].tolist()
    assert joined["loss_mask"].tolist() == a["loss_mask"].tolist() + b["loss_mask"].tolist()
    assert int(joined["max_seqlen_q"]) == max(int(a["max_seqlen_q"]), int(b["max_seqlen_q"]))
    assert two.epochs == one.epochs
    assert (
        PackedSFTRowsConfig(
            path=str(out), seq_length=ROW, rows_per_sample=2
        ).offline_packing_specs.packed_sequence_size
        == 2 * ROW
    )
    assert dry_run_problems(_Cfg(out, k=2))[0] == []
    (error,) = dry_run_problems(_Cfg(out, k=2, seq=ROW))[0]
    assert f"model.seq_length={2 * ROW}" in error
    with pytest.raises(ValueError, match="needs rows with boundaries"):
        PackedRowsDataset(REPO / "tests/fixtures/eos_joined_rows", 8192, 1, rows_per_sample=2)


def test_dry_run_refuses_what_packed_rows_cannot_run_with(built):
    out, _, _ = built
    assert dry_run_problems(_Cfg(out))[0] == []
    cases = [
        (dict(mbs=2), "set -mb 1"),
        (dict(cp=2), "set -cp 1"),
        (dict(graphs="transformer_engine"), "model.cuda_graph_impl=none"),
        (dict(deterministic=True), "model.deterministic_mode=false"),
    ]
    for kw, fix in cases:
        errors, _ = dry_run_problems(_Cfg(out, **kw))
        assert len(errors) == 1 and fix in errors[0] and "--packing one_per_row" in errors[0]


def test_eos_joined_template_rows_are_the_benchmark_layout(tmp_path):
    from bridge_recipes.chat.conversations import SftRowsError

    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps(conversation(i)) + "\n" for i in range(40)))
    m = build_sft_rows(src, TOKENIZER, tmp_path / "out", row_tokens=ROW, packing="eos_joined", progress=False)
    assert m["packing"] == "eos_joined" and m["padding_tokens"] == 0 and m["tail_tokens_dropped"] < ROW
    assert pq.read_schema(tmp_path / "out" / "rows.parquet").names == ["input_ids", "loss_mask"]
    ids = pq.read_table(tmp_path / "out" / "rows.parquet").column("input_ids").to_pylist()
    eos = m["eos_token_id"]
    assert sum(row.count(eos) for row in ids) >= m["rows"] - 1  # conversations joined by EOS across rows
    sample = PackedRowsDataset(tmp_path / "out", ROW, 1)[0]
    assert "cu_seqlens_q" not in sample and sample["position_ids"].tolist() == list(range(ROW))
    with pytest.raises(SftRowsError, match="supervise_eos applies to eos_joined rows"):
        build_sft_rows(src, TOKENIZER, tmp_path / "b", row_tokens=ROW, supervise_eos=True, progress=False)


def test_one_per_row_packer_closes_each_conversation_into_its_own_padded_row():
    from bridge_recipes.data.packing import packer_for

    p = packer_for("one_per_row", row_tokens=10, eos_id=0)
    (a,) = p.add(np.arange(1, 7), np.ones(6))
    (b,) = p.add(np.arange(1, 4), np.ones(3))  # would fit beside the first; gets a row of its own
    assert a.ids.tolist() == [1, 2, 3, 4, 5, 6, 0, 0, 0, 0] and a.mask.tolist() == [1] * 6 + [0] * 4
    assert a.cu is None and a.padding == 4 and b.padding == 7 and p.finish() == []
    assert p.padding_tokens == 11 and p.stream_tokens == 9 and p.conversations == 2
    assert not p.fits(11)
    with pytest.raises(ValueError, match="not one of"):
        packer_for("two_per_row", 10, 0)


def test_one_per_row_rows_hold_one_whole_conversation_and_train_without_thd(built, tmp_path):
    _, convs, _ = built
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in convs))
    m = build_sft_rows(
        src, TOKENIZER, tmp_path / "one", row_tokens=ROW, packing="one_per_row", progress=False, max_dropped_share=1
    )
    assert m["packing"] == "one_per_row" and m["rows"] == m["conversations"]["used"] == 40
    assert m["conversations"]["skipped"] == {"longer_than_row": 1}
    assert m["stream_tokens"] + m["padding_tokens"] == m["rows"] * ROW and m["tail_tokens_dropped"] == 0
    rendered = rendered_ids(convs[:40])
    table = pq.read_table(tmp_path / "one" / "rows.parquet")
    assert "cu_seqlens" not in table.column_names
    placed = []
    for ids, mask in zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()):
        (conv,) = [c for c in rendered if tuple(ids[: len(c)]) == c]  # one conversation from position 0,
        assert set(ids[len(conv) :]) == {m["eos_token_id"]} and not any(mask[len(conv) :])  # then padding
        placed.append(conv)
    assert set(placed) == rendered
    cfg = PackedSFTRowsConfig(path=str(tmp_path / "one"), seq_length=ROW)
    assert not cfg.enable_offline_packing  # the standard path: any micro batch, CP, CUDA graphs
    sample = PackedRowsDataset(tmp_path / "one", ROW, 1)[0]
    assert "cu_seqlens_q" not in sample and sample["position_ids"].tolist() == list(range(ROW))
    for mbs, cp, graphs in ((2, 1, "none"), (1, 2, "none"), (1, 1, "transformer_engine")):
        assert dry_run_problems(_Cfg(tmp_path / "one", mbs=mbs, cp=cp, graphs=graphs))[0] == []
    (error,) = dry_run_problems(_Cfg(tmp_path / "one", k=2))[0]
    assert "dataset.rows_per_sample=1" in error
    from bridge_recipes.chat.conversations import SftRowsError

    with pytest.raises(SftRowsError, match="one_per_row rows have no EOS separators"):
        build_sft_rows(src, TOKENIZER, tmp_path / "x", row_tokens=ROW, packing="one_per_row", supervise_eos=True)
