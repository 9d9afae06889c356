"""A run's settings read from environment variables: the process's environment over the recipe's
``env_vars``, the precedence the runner applies when it launches the training process."""

from __future__ import annotations

from collections.abc import Mapping

OFF = ("", "0", "false", "no", "off")


def setting(name: str, env_vars: Mapping | None, environ: Mapping | None = None, default: str = "") -> str:
    """``name``'s value, stripped and lower-cased: the process's (``environ``, ``os.environ`` when None)
    over the recipe's ``env_vars``, ``default`` when neither sets it."""
    import os

    process = os.environ if environ is None else environ
    value = process.get(name, (env_vars or {}).get(name, default))
    return str(value).strip().lower()


def switched_on(name: str, env_vars: Mapping | None, environ: Mapping | None = None) -> bool:
    """Whether ``name`` is set to anything but empty, 0, false, no or off."""
    return setting(name, env_vars, environ) not in OFF


def env_advice(name: str, value: str, environ: Mapping | None = None) -> str:
    """The override that sets ``name`` for a run (``+env_vars.NAME=VALUE``). An exported ``name`` wins over
    the config's ``env_vars`` (:func:`setting`), so where the process exports it the advice says so: the
    export is what to change."""
    import os

    process = os.environ if environ is None else environ
    advice = f"+env_vars.{name}={value}"
    if name in process:
        advice += (
            f" (but {name}={process[name]} is exported, and an exported value wins over env_vars: "
            f"export {name}={value} or unset it instead)"
        )
    return advice
