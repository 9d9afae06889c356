"""Qwen3.5 / Qwen3.6 benchmark recipes (mock data) sharing the execution policies of bridge_recipes."""
