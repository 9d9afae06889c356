"""The measurement lab beside the product: evidence assembly, peer comparisons, reports,
candidate policies, GPU queues, and the committed evidence and result files they read.

The lab imports the product (``bridge_recipes``); nothing in the product imports the lab or opens
a file under it. A recipe names its evidence by an id, its path inside this folder
(``results/...`` or ``evidence/...``), which :func:`resolve` turns into a file.
"""

from __future__ import annotations

from pathlib import Path

LAB = Path(__file__).resolve().parent
ROOT = LAB.parent
EVIDENCE = LAB / "evidence"
RESULTS = LAB / "results"


def resolve(evidence_id: str) -> Path:
    """The file behind a recipe's evidence id (``RecipeMeta.evidence`` or ``measured["result"]``)."""
    path = LAB / evidence_id
    if not path.resolve().is_relative_to(LAB) or not evidence_id.startswith(("results/", "evidence/")):
        raise ValueError(f"evidence id {evidence_id!r} is not a path under lab/results/ or lab/evidence/")
    return path
