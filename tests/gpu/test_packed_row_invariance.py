"""A conversation's loss does not depend on the row it sits in, on one H200.

At one set of weights (the recipe's model at 4 layers, BF16, the recipe's kernels, attention one
conversation at a time), the 12 aligned conversations of 640 tokens (``build_aligned_rows``) run
forward alone (each in a 2,048-token row of its own, padding after it, no boundaries: a
``one_per_row`` sample) and in each layout of :data:`LAYOUTS`: in the packed rows of 2,048 tokens
the builder makes (three conversations and a padding segment), in two of those rows joined into one sequence
(a padding segment in the middle), and in rows of 4,096 and 8,192 tokens (6 and 12 conversations,
the padding at the end). For each layout and conversation: its summed loss against the same
conversation alone, and, layer by layer, the largest difference of its hidden states from alone
relative to their largest magnitude (where a difference starts). The floor is what the builder's
own rows give (their step-1 loss matches one conversation a row exactly in training); it must be
at most :data:`MIN_TOLERANCE`, and every layout within :data:`FLOOR_FACTOR` times it (or that).

    OUT=/path python3 -m pytest -q -m gpu tests/gpu/test_packed_row_invariance.py

Writes ``$OUT/packed_row_invariance.log`` (a JSON line a family and layout) and
``$OUT/packed_row_invariance.json`` (every family's layouts, the floor, and whether each holds).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from bridge_recipes.data.synthetic_chat import EVIDENCE_ROW_TOKENS, build_aligned_rows

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
OUT = Path(os.environ.get("OUT") or REPO / "gpu-out")
ROW = EVIDENCE_ROW_TOKENS
ROWS_USED = 4  # the first 4 packed rows: 12 conversations
LONGEST = 8192
# layout: row length (None: the builder's rows, joined k at a time) and the rows joined a sequence
LAYOUTS = {
    "rows_2048": (None, 1),
    "joined_2_rows": (None, 2),
    "row_4096": (4096, None),
    "row_8192": (LONGEST, None),
}
FLOOR_LAYOUT = "rows_2048"
FLOOR_FACTOR = 3.0
MIN_TOLERANCE = 5e-4  # relative: a floor of exactly 0 still leaves BF16 rounding of other GEMM shapes
NO_AUX = {"moe_aux_loss_coeff": 0.0, "moe_router_load_balancing_type": "none"}
FAMILIES = {"qwen35_27b": {}, "qwen35_35b_a3b": NO_AUX}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """The aligned boundaries rows' ids, masks and boundaries, and the model-parallel state."""
    from bridge_recipes.data.packed_rows import PackedRowsDataset
    from bridge_recipes.hf.parity import init_single_gpu

    init_single_gpu()
    folder = tmp_path_factory.mktemp("rows") / "boundaries"
    build_aligned_rows(folder, TOKENIZER, "boundaries")
    return PackedRowsDataset(folder, ROW, ROWS_USED)


def conversations(data) -> tuple[list[tuple], int]:
    """The conversations of the first rows, in order, as (ids, mask); and the padding token."""
    from bridge_recipes.data.inspect_rows import row_conversations

    eos = data.manifest["eos_token_id"]
    rows = zip(data.ids[:ROWS_USED], data.mask[:ROWS_USED], data.cu[:ROWS_USED])
    return [conv for ids, mask, cu in rows for conv in row_conversations(ids, mask, cu, "boundaries", eos)], eos


def sequences(data, layout: str) -> list[tuple]:
    """The layout's sequences as (ids, mask, boundaries)."""
    import numpy as np

    from bridge_recipes.data.packed_rows import joined_rows

    length, join = LAYOUTS[layout]
    if length is None:  # the builder's rows, ``join`` at a time
        groups = [range(first, first + join) for first in range(0, ROWS_USED, join)]
        return [
            joined_rows([data.ids[r] for r in rs], [data.mask[r] for r in rs], [data.cu[r] for r in rs])
            for rs in groups
        ]
    convs, pad = conversations(data)
    conv_mask_dtype = convs[0][1].dtype
    out, seq = [], []
    for conv in convs + [None]:
        if conv is not None and sum(len(c[0]) for c in seq) + len(conv[0]) <= length:
            seq.append(conv)
            continue
        used = sum(len(c[0]) for c in seq)
        filler = (np.full(length - used, pad), np.zeros(length - used, dtype=conv_mask_dtype))
        parts = seq + ([filler] if used < length else [])
        cu = [0, *np.cumsum([len(p[0]) for p in parts]).tolist()]
        out.append((np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), cu))
        seq = [conv] if conv is not None else []
    return out


def forward(model, ids, mask, cu, hidden: list, spans=None) -> tuple[list[float], list]:
    """Per-token losses of one sequence (THD when ``cu``), summed over each conversation's span (by
    default the supervised segments of ``cu``), and each decoder layer's output over those spans."""
    import torch
    from megatron.bridge.training.gpt_step import _packed_metadata_for_forward
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    from bridge_recipes.data.packed_rows import row_sample

    sample = row_sample(ids, mask, cu)
    params = None
    if cu is not None:
        meta = _packed_metadata_for_forward({k: v[None] for k, v in sample.items()})
        params = get_packed_seq_params({k: (v.cuda() if k.startswith("cu_") else v) for k, v in meta.items()})
    t, lab, m, pos = (sample[k].cuda() for k in ("tokens", "labels", "loss_mask", "position_ids"))
    hidden.clear()
    with torch.no_grad():
        out = model(
            input_ids=t[None],
            position_ids=pos[None],
            attention_mask=None,
            labels=lab[None],
            loss_mask=m[None],
            packed_seq_params=params,
        )
    loss = out.float().view(-1) * m.float()
    if spans is None:
        spans = [(s, e) for s, e in zip(cu[:-1], cu[1:]) if mask[s:e].sum() > 0]
    layers = [[h[s:e].float() for s, e in spans] for h in hidden]
    return [float(loss[s:e].sum()) for s, e in spans], layers


def test_a_conversations_loss_does_not_depend_on_its_row(rows, bare_model):
    import numpy as np
    import torch

    from bridge_recipes.features import packed_attention

    packed_attention.install(SimpleNamespace(features=SimpleNamespace(packed_attention=packed_attention.Config())))
    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / "packed_row_invariance.log"
    log.unlink(missing_ok=True)
    result: dict = {"layouts": {k: {"row_tokens": v[0] or ROW * v[1]} for k, v in LAYOUTS.items()}}
    convs, pad = conversations(rows)
    hidden: list = []  # each decoder layer's output of the last forward, filled by hooks

    def keep_output(_module, _args, output):
        hidden.append((output[0] if isinstance(output, tuple) else output)[:, 0])  # [s, b, h] -> [s, h]

    for family, changes in FAMILIES.items():
        model = bare_model.build(family, {**changes, "seq_length": LONGEST})
        hooks = [layer.register_forward_hook(keep_output) for layer in model.decoder.layers]
        alone_loss, alone_layers = [], []
        for ids, mask in convs:  # a one_per_row sample: the conversation, then padding to the row
            padded = np.concatenate([ids, np.full(ROW - len(ids), pad)])
            padded_mask = np.concatenate([mask, np.zeros(ROW - len(ids), dtype=mask.dtype)])
            (loss,), layers = forward(model, padded, padded_mask, None, hidden, spans=[(0, len(ids))])
            alone_loss.append(loss)
            alone_layers.append([x[0] for x in layers])
        found: dict = {}
        for layout in LAYOUTS:
            losses, layers_by_conv = [], []
            for ids, mask, cu in sequences(rows, layout):
                seq_losses, layers = forward(model, ids, mask, cu, hidden)
                losses += seq_losses
                layers_by_conv += [[layer[i] for layer in layers] for i in range(len(seq_losses))]
            assert len(losses) == len(convs), (layout, len(losses))
            rel = [abs(a - b) / abs(b) for a, b in zip(losses, alone_loss)]
            per_layer = [
                max(
                    float((c[i] - a[i]).abs().max() / a[i].abs().max().clamp_min(1e-6))
                    for c, a in zip(layers_by_conv, alone_layers)
                )
                for i in range(len(alone_layers[0]))
            ]
            found[layout] = {
                "max_rel_loss_diff": max(rel),
                "rel_loss_diff": [round(x, 7) for x in rel],
                "loss": sum(losses),
                "alone_loss": sum(alone_loss),
                "max_rel_hidden_diff_by_layer": [round(x, 6) for x in per_layer],
            }
            line = {"family": family, "layout": layout, **found[layout]}
            with open(log, "a") as f:
                f.write(json.dumps(line) + "\n")
            print(json.dumps({k: v for k, v in line.items() if k != "rel_loss_diff"}), flush=True)
        for h in hooks:
            h.remove()
        floor = found[FLOOR_LAYOUT]["max_rel_loss_diff"]
        tolerance = max(FLOOR_FACTOR * floor, MIN_TOLERANCE)
        for figures in found.values():
            figures["holds"] = floor <= MIN_TOLERANCE and figures["max_rel_loss_diff"] <= tolerance
        result[family] = {"floor": floor, "tolerance": tolerance, **found}
        del model
        torch.cuda.empty_cache()
    (OUT / "packed_row_invariance.json").write_text(json.dumps(result, indent=1) + "\n")
    failing = [(f, lay) for f in FAMILIES for lay in LAYOUTS if not result[f][lay]["holds"]]
    assert not failing, failing
