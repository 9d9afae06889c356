"""What held the GPU's memory in a CUDA caching-allocator snapshot, grouped by the code that allocated it.

A run with ``profiling.record_memory_history=true`` writes such a snapshot when it runs out of memory
(Megatron-Bridge's out-of-memory observer) or at ``profiling.profile_step_end``. The planner's terms are
checked against it: the live blocks are summed per allocating call site, the innermost frames of the
training stack (Megatron, Transformer Engine, flash-linear-attention, this project), so a term the planner
lacks shows up as a site it does not count.

    python -m lab.memory_snapshot SNAPSHOT.pickle [--top 40] > summary.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections import defaultdict
from typing import Any

# frames from these packages name a site; torch's own and Python's plumbing above them do not
SITE_PACKAGES = ("megatron/", "transformer_engine/", "fla/", "bridge_recipes/", "torch/utils/checkpoint.py")
FRAMES_PER_SITE = 3
GB = 1e9


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


def summarize(snapshot: dict[str, Any], top: int = 40) -> dict[str, Any]:
    """Live (allocated) bytes per allocating site, the largest first, and the allocator's totals."""
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    allocated = reserved = 0
    for segment in snapshot.get("segments", []):
        reserved += int(segment.get("total_size", 0))
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            size = int(block.get("size", 0))
            allocated += size
            entry = by_site[_site(block.get("frames") or [])]
            entry[0] += size
            entry[1] += 1
    sites = sorted(by_site.items(), key=lambda kv: -kv[1][0])
    return {
        "allocated_gb": round(allocated / GB, 3),
        "reserved_gb": round(reserved / GB, 3),
        "sites": [{"gb": round(size / GB, 3), "blocks": count, "site": site} for site, (size, count) in sites[:top]],
        "other_sites_gb": round(sum(size for _, (size, _c) in sites[top:]) / GB, 3),
    }


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
