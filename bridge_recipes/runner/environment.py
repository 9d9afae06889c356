"""Put a recipe's ``env_vars`` into the process environment before TE and NCCL read them.

Transformer Engine reads some settings once, at import (e.g. ``NVTE_CUTEDSL_FUSED_GROUPED_MLP``),
and building a recipe imports it. So the runner builds the recipe, then re-executes itself
once with the recipe's variables added: the new interpreter imports TE with them in place.
A marker variable holding the first process's pid stops a second re-exec. Values the user
already set win (as Megatron-Bridge's own ``apply_environment_variables`` does).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

MARKER = "QWEN35_RECIPES_REEXEC"


def missing(env_vars: Mapping[str, object], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Recipe variables not yet in the environment (user-set values are never replaced)."""
    environ = os.environ if environ is None else environ
    return {k: str(v) for k, v in env_vars.items() if k not in environ}


def already_reexecuted(environ: Mapping[str, str] | None = None) -> bool:
    return MARKER in (os.environ if environ is None else environ)


def own_command() -> list[str]:
    """This process's arguments after the interpreter: ``-m MODULE ARGS`` when it was started with
    ``python -m`` (running the module's file as a script would put its folder first on sys.path),
    else the script and its arguments."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return ["-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    return list(sys.argv)


def reexec_with(env_vars: Mapping[str, object], argv: list[str] | None = None) -> None:
    """Replace this process with a fresh interpreter that has ``env_vars`` set; returns only
    when nothing needs setting or the re-exec already happened."""
    todo = missing(env_vars)
    if not todo or already_reexecuted():
        return
    env = dict(os.environ, **todo, **{MARKER: str(os.getpid())})
    argv = list(own_command() if argv is None else argv)
    # the second interpreter imports the stack again (~35 s on the H200 test host); exporting
    # the recipe's variables before launch skips it
    print(
        f"[run_recipe] re-executing with {len(todo)} recipe environment variable(s): {', '.join(sorted(todo))} "
        f"(export them before launch to skip this: {' '.join(f'{k}={v}' for k, v in sorted(todo.items()))})",
        flush=True,
    )
    os.execvpe(sys.executable, [sys.executable, *argv], env)
