"""The allocator-snapshot summary: live blocks summed per allocating site of the training stack."""

import json
import pickle

from lab import memory_snapshot

TE = "/x/site-packages/transformer_engine/pytorch/module/grouped_linear.py"
MCORE = "/x/site-packages/megatron/core/transformer/moe/experts.py"


def _block(size, state, frames):
    return {"size": size, "state": state, "frames": frames}


def _snapshot():
    te = [
        {"filename": "/x/site-packages/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
        {"filename": TE, "line": 480, "name": "forward"},
        {"filename": MCORE, "line": 797, "name": "forward"},
    ]
    return {
        "segments": [
            {
                "total_size": 6_000_000_000,
                "blocks": [
                    _block(2_000_000_000, "active_allocated", te),
                    _block(1_000_000_000, "active_allocated", te),
                    _block(2_500_000_000, "inactive", te),
                    _block(500_000_000, "active_allocated", []),
                ],
            }
        ]
    }


def test_live_blocks_are_summed_per_site_and_free_ones_left_out():
    summary = memory_snapshot.summarize(_snapshot())
    assert summary["allocated_gb"] == 3.5
    assert summary["reserved_gb"] == 6.0
    first = summary["sites"][0]
    assert first["gb"] == 3.0 and first["blocks"] == 2
    # torch's plumbing is skipped: the site starts at Transformer Engine, then Megatron-Core
    assert first["site"].startswith("transformer_engine/pytorch/module/grouped_linear.py:480 forward < megatron/")
    assert summary["sites"][1]["site"] == "(no training-stack frame)"


def test_top_keeps_the_rest_as_one_sum():
    summary = memory_snapshot.summarize(_snapshot(), top=1)
    assert len(summary["sites"]) == 1
    assert summary["other_sites_gb"] == 0.5


def test_command_line_reads_a_pickle_and_refuses_other_files(tmp_path, capsys):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))
    assert memory_snapshot.main([str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["allocated_gb"] == 3.5
    other = tmp_path / "o.pickle"
    other.write_bytes(pickle.dumps([1, 2]))
    assert memory_snapshot.main([str(other)]) == 2
    assert "not a CUDA allocator snapshot" in capsys.readouterr().err
    assert memory_snapshot.main([str(tmp_path / "missing.pickle")]) == 2


def _frames(name):
    return [{"filename": f"/x/site-packages/megatron/core/{name}.py", "line": 1, "name": name}]


def _with_history(events):
    return {
        "segments": [
            {
                "address": 0,
                "total_size": 8_000_000_000,
                "blocks": [{"address": 0, "size": 1_000_000_000, "state": "active_allocated", "frames": _frames("a")}],
            }
        ],
        "device_traces": [events],
    }


def test_peak_is_found_by_undoing_the_history_from_the_snapshot():
    gb = 1_000_000_000
    events = [
        {"action": "alloc", "addr": 0, "size": gb, "frames": _frames("a")},
        {"action": "alloc", "addr": gb, "size": 2 * gb, "frames": _frames("b")},
        {"action": "alloc", "addr": 3 * gb, "size": 3 * gb, "frames": _frames("c")},
        {"action": "free_requested", "addr": 3 * gb, "size": 3 * gb, "frames": _frames("free_c")},
        {"action": "free_completed", "addr": 3 * gb, "size": 3 * gb, "frames": []},
        {"action": "free_requested", "addr": gb, "size": 2 * gb, "frames": _frames("free_b")},
    ]
    summary = memory_snapshot.summarize(_with_history(events))
    assert summary["allocated_gb"] == 1.0
    peak = summary["peak"]
    assert peak["allocated_gb"] == 6.0 and peak["actions_before_snapshot"] == 3
    # blocks freed after the peak are named where they were allocated, not where they were freed
    assert [(s["gb"], s["site"].split(":")[0]) for s in peak["sites"]] == [
        (3.0, "megatron/core/c.py"),
        (2.0, "megatron/core/b.py"),
        (1.0, "megatron/core/a.py"),
    ]


def test_a_block_allocated_before_the_history_is_named_where_it_was_freed():
    gb = 1_000_000_000
    events = [{"action": "free_requested", "addr": 5 * gb, "size": 4 * gb, "frames": _frames("free_d")}]
    peak = memory_snapshot.summarize(_with_history(events))["peak"]
    assert peak["allocated_gb"] == 5.0
    assert peak["sites"][0]["site"].startswith("megatron/core/free_d.py")


def test_no_history_no_peak():
    assert "peak" not in memory_snapshot.summarize(_snapshot())
