"""Recipe names in committed results that are not the recipe's name today.

A result names the recipe it measured as the recipe was then called; when a name moves to another
config (the plainly named one-GPU LoRA recipes became the fastest, the leaner ones took ``_lowmem``),
results measured before the move keep their words and are read through :func:`current`.
"""

from __future__ import annotations

# results measured before this date name the recipes by their earlier names
RENAMED_ON = "2026-12-05"
EARLIER_NAMES = {
    "qwen35_27b_peft_1gpu_h200_bf16_config": "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config",
    "qwen35_27b_peft_1gpu_h200_bf16_fast_config": "qwen35_27b_peft_1gpu_h200_bf16_config",
    "qwen35_35b_a3b_peft_1gpu_h200_bf16_config": "qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config",
    "qwen35_35b_a3b_peft_1gpu_h200_bf16_fast_config": "qwen35_35b_a3b_peft_1gpu_h200_bf16_config",
}


def current(name: str, measured_on: str) -> str:
    """The recipe's name today for ``name`` in a result dated ``measured_on`` (ISO date)."""
    if str(measured_on)[:10] < RENAMED_ON:
        return EARLIER_NAMES.get(name, name)
    return name
