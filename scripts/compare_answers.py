#!/usr/bin/env python3
"""A fine-tune's answers beside its base model's, in transformers (greedy, one model in memory at a time):

    python scripts/compare_answers.py --base /models/Qwen3.6-35B-A3B --export /out/export --rows /data/rows
    python scripts/compare_answers.py --base /models/Qwen3.6-35B-A3B --adapter /out/export-adapter \
        --prompt "Summarize the contract in two sentences."

The tuned model is the merged export or the base with the adapter folder on it; the prompts are given
(--prompt TEXT, or --prompts FILE of conversation records asked up to their first reply) or the first
validation conversations of a rows folder (--rows DIR), cut where training's supervision starts, with the
training data's reply beside the answers. A GPU when there is one (BF16), else the CPU (FP32: toys).
Exit status 2 on bad input. The logic lives in bridge_recipes.evaluate.answers.
"""

import sys

from bridge_recipes.evaluate.answers import main
from bridge_recipes.utils import quiet

if __name__ == "__main__":
    quiet.install()  # other libraries' start-up notices (shown with --verbose)
    sys.exit(main())
