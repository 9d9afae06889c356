"""Exit 0 when the GPU this host gives torch reports at least GB (1e9 bytes) of memory, else 1 saying
so: a queue line that needs an H200's memory starts ``python3 lab/gpu/needs_memory.py 140 && ...``
and is skipped, in seconds, on a host lent with an 80 GB card.

    python3 lab/gpu/needs_memory.py GB
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: needs_memory.py GB", file=sys.stderr)
        return 2
    try:
        need = float(argv[0])
    except ValueError:
        print(f"needs_memory.py: GB {argv[0]!r}: a number of GB (1e9 bytes)", file=sys.stderr)
        return 2
    from bridge_recipes.hardware.gpu_memory import current_device

    device = current_device()
    if device is None:
        print(f"skipped: the queue line needs a GPU of {need:g} GB and torch sees no CUDA GPU")
        return 1
    if device.memory_gb < need:
        print(f"skipped: the queue line needs a GPU of {need:g} GB; this {device.name} has {device.memory_gb:.1f} GB")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
