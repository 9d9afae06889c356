#!/usr/bin/env python3
"""Run a Qwen3.5 / Qwen3.6 recipe:

    torchrun --nproc-per-node 8 scripts/run_recipe.py --recipe NAME [flags] [KEY=VALUE ...]
    python scripts/run_recipe.py --list [--filter h200]
    python scripts/run_recipe.py --recipe NAME --dry-run --world-size 8

The logic lives in bridge_recipes.runner (importable and tested); see --help.
"""

import os
import sys

# Recorded before anything else is imported: what the interpreter started with (the re-exec
# puts recipe environment variables in place before Transformer Engine is imported).
START_STATE = {"transformer_engine_imported": "transformer_engine" in sys.modules, "environ": dict(os.environ)}

from bridge_recipes.runner.cli import main  # noqa: E402 (imported after START_STATE is recorded)

if __name__ == "__main__":
    sys.exit(main(start_state=START_STATE))
