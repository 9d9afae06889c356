"""Hugging Face checkpoints: check against the catalog, import to Megatron, export back, toy makers."""
