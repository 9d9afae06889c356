"""The Jinja sandbox of a chat template transformers compiles remembers its verdict on each (object type,
attribute).

transformers compiles a chat template once per template text
(``transformers.utils.chat_template_utils._compile_jinja_template``) into Jinja's immutable sandbox,
whose ``is_safe_attribute`` verdict depends on the object's type and the attribute's name only; deciding
it again on every attribute a template reads is most of a long conversation's rendering time. The
renderer (``bridge_recipes.chat.chat_template``) calls :func:`memoize` on its template. Outside the
versions it was written for, or with the symbols moved, nothing is patched: renders stay correct, only
slower."""

from __future__ import annotations

from typing import Any

from bridge_recipes.patches.contract import Patch, problems


def memoize(template: str) -> bool:
    """Remember the sandbox's verdicts for ``template`` as transformers compiles it; whether it is in
    place (False: the contract does not hold, or transformers cannot compile the template)."""
    if problems(PATCH):
        return False
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        environment = _compile_jinja_template(template).environment
        decide = environment.is_safe_attribute
    except Exception:  # a template transformers cannot compile: nothing to remember
        return False
    if getattr(decide, "memoized", False):
        return True
    verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        verdict = verdicts.get(key)
        if verdict is None:
            verdict = verdicts[key] = decide(obj, attr, value)
        return verdict

    is_safe_attribute.memoized = True  # type: ignore[attr-defined]
    environment.is_safe_attribute = is_safe_attribute
    return True


PATCH = Patch(
    name="jinja_sandbox",
    what="a chat template's Jinja sandbox remembers its attribute verdicts (faster rendering)",
    written_for={"transformers": ">=5.12,<5.13", "jinja2": ">=3.1,<3.2"},
    targets={
        "transformers.utils.chat_template_utils._compile_jinja_template": ("chat_template",),
        "jinja2.sandbox.ImmutableSandboxedEnvironment.is_safe_attribute": ("self", "obj", "attr", "value"),
    },
)
