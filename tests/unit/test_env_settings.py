"""A run's settings from environment variables: the process's over the recipe's env_vars."""

from __future__ import annotations

from bridge_recipes.runner.env_settings import setting, switched_on


def test_the_process_wins_over_the_recipe_and_values_are_normalised():
    assert setting("X", {"X": " FP8 "}, {}) == "fp8"
    assert setting("X", {"X": "fp8"}, {"X": "BF16"}) == "bf16"
    assert setting("X", None, {}, default="bf16") == "bf16"
    assert setting("X", {"X": 1}, {}) == "1"  # a recipe may hold a number


def test_switched_on_reads_the_usual_spellings_of_off():
    for off in ("", "0", "false", "No", "OFF"):
        assert not switched_on("X", {"X": off}, {})
    assert not switched_on("X", None, {})
    assert switched_on("X", {"X": "1"}, {}) and switched_on("X", None, {"X": "yes"})
    assert not switched_on("X", {"X": "1"}, {"X": "0"})  # the process turns the recipe's off
