"""``python -m bridge_recipes.runner``: run a recipe (the command line of scripts/run_recipe.py).

What the process held before the runner was imported is recorded first: whether Transformer Engine
was already imported, and the environment, so the runner can tell the recipe's variables apart from
the user's.
"""

import os
import sys

START_STATE = {"transformer_engine_imported": "transformer_engine" in sys.modules, "environ": dict(os.environ)}

from bridge_recipes.runner.cli import main  # noqa: E402
from bridge_recipes.utils import quiet  # noqa: E402 (imported after START_STATE is recorded)


def run() -> int:
    quiet.install()
    return main(start_state=START_STATE)


if __name__ == "__main__":
    sys.exit(run())
