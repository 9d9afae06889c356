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
