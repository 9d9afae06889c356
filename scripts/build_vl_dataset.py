#!/usr/bin/env python3
"""Build the Energon dataset the VL recipes read from your own image conversations:

    python scripts/build_vl_dataset.py --input conversations.jsonl --processor /models/Qwen3.6-35B-A3B \\
        --out data/vl --val-fraction 0.05
    torchrun ... scripts/run_recipe.py --recipe qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config \\
        --hf-checkpoint /models/Qwen3.6-35B-A3B --dataset energon dataset.path=data/vl

Records carry OpenAI image parts (``image_url`` with a ``file://`` URL, ``image`` with a path) or
LLaVA ``<image>`` placeholders with an ``images`` list; paths are relative to the JSONL file or
absolute. A conversation with a missing, unreadable or oversized image is skipped and counted by
reason. Writes the shards, Energon's metadata, samples.parquet and manifest.json into --out, all
at once when the build completes; bad input exits with status 2. The logic lives in
bridge_recipes.vl.vl_dataset (importable and tested).
"""

from __future__ import annotations

import sys

from bridge_recipes.utils import quiet
from bridge_recipes.utils.outputs import exit_on_termination
from bridge_recipes.vl.vl_cli import main

if __name__ == "__main__":
    quiet.install()  # other libraries' start-up notices (shown with --verbose)
    exit_on_termination()  # a kill removes the staging folder beside --out
    sys.exit(main())
