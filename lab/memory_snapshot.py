"""What held the GPU's memory in a CUDA caching-allocator snapshot, grouped by the code that allocated it.

A run with ``profiling.record_memory_history=true`` writes such a snapshot, with the allocator's recent
history, when it runs out of memory (Megatron-Bridge's out-of-memory observer) or at
``profiling.profile_step_end``. The planner's terms are checked against it: the allocated blocks, when the
snapshot was taken and at the history's peak, are summed per allocating call site, the innermost frames of
the training stack (Megatron, Transformer Engine, flash-linear-attention, this project), so a term the
planner lacks shows up as a site it does not count.

    python -m lab.memory_snapshot SNAPSHOT.pickle [--top 40] > summary.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections import defaultdict
from typing import Any

from bridge_recipes.hardware.gpus import GB

# frames from these packages name a site; torch's own and Python's plumbing above them do not
SITE_PACKAGES = ("megatron/", "transformer_engine/", "fla/", "bridge_recipes/", "torch/utils/checkpoint.py")
FRAMES_PER_SITE = 3


def _site(frames: list[dict[str, Any]]) -> str:
    """The innermost frames of the training stack that allocated a block, innermost first."""
    kept = []
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if any(p in filename for p in SITE_PACKAGES):
            short = filename.split("site-packages/")[-1]
            kept.append(f"{short}:{frame.get('line', '?')} {frame.get('name', '?')}")
            if len(kept) == FRAMES_PER_SITE:
                break
    return " < ".join(kept) if kept else "(no training-stack frame)"


Block = tuple[int, list[dict[str, Any]]]  # size, allocating frames


def _by_site(blocks: list[Block], top: int) -> dict[str, Any]:
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, frames in blocks:
        entry = by_site[_site(frames)]
        entry[0] += size
        entry[1] += 1
    sites = sorted(by_site.items(), key=lambda kv: -kv[1][0])
    return {
        "allocated_gb": round(sum(size for size, _ in blocks) / GB, 3),
        "sites": [{"gb": round(size / GB, 3), "blocks": count, "site": site} for site, (size, count) in sites[:top]],
        "other_sites_gb": round(sum(size for _, (size, _c) in sites[top:]) / GB, 3),
    }


def _live_at_end(snapshot: dict[str, Any]) -> dict[int, Block]:
    """The allocated blocks when the snapshot was taken, by address."""
    live = {}
    for segment in snapshot.get("segments", []):
        address = int(segment.get("address", 0))
        for block in segment.get("blocks", []):
            address = int(block.get("address", address))
            size = int(block.get("size", 0))
            if block.get("state") == "active_allocated":
                live[address] = (size, block.get("frames") or [])
            address += size
    return live


def _history(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The allocator's recorded actions on the device that has most of them (empty without a history)."""
    return max((t for t in snapshot.get("device_traces") or [] if t), key=len, default=[])


def _peak(snapshot: dict[str, Any]) -> tuple[int, dict[int, Block]] | None:
    """The most memory allocated within the recorded history, as the number of actions before the
    snapshot, and the blocks allocated then; None without a history. Found by undoing the history's
    allocations and frees from the snapshot's end; a block freed after the peak is named by the frames
    of its allocation where the history holds it."""
    events = _history(snapshot)
    if not events:
        return None
    alloc_frames: dict[int, list[dict[str, Any]]] = {}
    freed_frames: dict[int, list[dict[str, Any]]] = {}  # index of a free -> its allocation's frames
    for i, event in enumerate(events):
        if event.get("action") == "alloc":
            alloc_frames[int(event["addr"])] = event.get("frames") or []
        elif event.get("action") == "free_requested":
            freed_frames[i] = alloc_frames.get(int(event["addr"]), event.get("frames") or [])

    def undo(live: dict[int, Block], i: int) -> int:
        action, addr = events[i].get("action"), int(events[i].get("addr", 0))
        if action == "alloc" and addr in live:
            return -live.pop(addr)[0]
        if action == "free_requested":
            live[addr] = (int(events[i].get("size", 0)), freed_frames[i])
            return live[addr][0]
        return 0

    live = _live_at_end(snapshot)
    total = best = sum(size for size, _ in live.values())
    best_at = len(events)  # the peak is the state before action best_at
    for i in range(len(events) - 1, -1, -1):
        total += undo(live, i)
        if total > best:
            best, best_at = total, i
    live = _live_at_end(snapshot)
    for i in range(len(events) - 1, best_at - 1, -1):
        undo(live, i)
    return len(events) - best_at, live


def summarize(snapshot: dict[str, Any], top: int = 40) -> dict[str, Any]:
    """Allocated bytes per allocating site, the largest first, when the snapshot was taken and, where it
    holds the allocator's history, at the history's peak; and the memory reserved."""
    out = {
        "reserved_gb": round(sum(int(s.get("total_size", 0)) for s in snapshot.get("segments", [])) / GB, 3),
        **_by_site(list(_live_at_end(snapshot).values()), top),
    }
    peak = _peak(snapshot)
    if peak is not None:
        before_end, live = peak
        out["peak"] = {"actions_before_snapshot": before_end, **_by_site(list(live.values()), top)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot", help="a pickle written by torch.cuda.memory._snapshot()")
    parser.add_argument("--top", type=int, default=40, help="sites listed (default 40)")
    args = parser.parse_args(argv)
    try:
        with open(args.snapshot, "rb") as f:
            snapshot = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError) as exc:
        print(f"memory_snapshot: cannot read {args.snapshot}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        print(f"memory_snapshot: {args.snapshot} is not a CUDA allocator snapshot (no 'segments')", file=sys.stderr)
        return 2
    json.dump(summarize(snapshot, args.top), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
