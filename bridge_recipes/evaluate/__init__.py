"""Looking at a fine-tune: its answers beside its base model's (``scripts/compare_answers.py``)."""
