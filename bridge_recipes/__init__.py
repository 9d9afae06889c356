"""Qwen3.5 / Qwen3.6 real-data training recipes for Megatron-Bridge."""
