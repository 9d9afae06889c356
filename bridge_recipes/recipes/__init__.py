"""The recipes: their definitions (``qwen``, ``qwen_vl``), the base builders and policy blocks they
start from, the registry that finds them, their scale-down and the cards they fit."""
