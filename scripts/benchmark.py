#!/usr/bin/env python3
"""Benchmark a recipe (and, side by side, a second one) and write OpenRecipes-shaped result files.

    python scripts/benchmark.py --recipe NAME --out results/x.yaml
    python scripts/benchmark.py --proxy-layers 4 --recipe A --against B --out results/a_vs_b.yaml

The logic lives in bridge_recipes.bench.benchmark (importable and tested); see --help.
"""

import sys

from bridge_recipes.bench.benchmark import main
from bridge_recipes.utils import quiet

if __name__ == "__main__":
    quiet.install()  # other libraries' start-up notices (shown with --verbose)
    sys.exit(main())
