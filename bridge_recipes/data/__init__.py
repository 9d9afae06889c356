"""Data builders for the Qwen3.5 / Qwen3.6 recipes (offline; no network at import time)."""
