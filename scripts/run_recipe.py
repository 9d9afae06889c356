#!/usr/bin/env python3
"""Run a Qwen3.5 / Qwen3.6 recipe:

    torchrun --nproc-per-node 8 scripts/run_recipe.py --recipe NAME [flags] [KEY=VALUE ...]
    python scripts/run_recipe.py --list [--filter h200]
    python scripts/run_recipe.py --recipe NAME --dry-run --world-size 8

The same as ``python -m bridge_recipes.runner``; the logic lives in bridge_recipes.runner (see --help).
"""

import sys

from bridge_recipes.runner.__main__ import run

if __name__ == "__main__":
    sys.exit(run())
