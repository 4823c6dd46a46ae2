"""Settings groups read from ``SPARKIQ_<GROUP>_<NAME>`` variables, the one way.

The limits of each listener and engine (``HttpLimits``, ``PgLimits``, ``SqlLimits``, the
failed-authentication ``AuthPolicy``) are groups of numbers and sizes with one variable each. They
are resolved alike: a keyword argument (not None) wins, then the variable (an empty one is
unset), then the field's default; a variable that does not parse as its field's type is a
:class:`~sparkiq.errors.ConfigError` naming the variable, and so is an unknown keyword.
:class:`~sparkiq.serving.config.NodeConfig` is their one caller: it resolves every group of
a node once (``NodeConfig.resolve(environ=...)``) and hands each to the component that
enforces it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sparkiq.errors import ConfigError

__all__ = ["dataclass_from_env", "values_from_env"]

T = TypeVar("T")

_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


def values_from_env(
    kinds: Mapping[str, Callable[[str], Any]],
    group: str,
    overrides: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The given values of ``kinds``' names: ``overrides`` first, then the variables
    ``SPARKIQ_<group>_<NAME>`` parsed with each name's kind (see the module docstring)."""
    unknown = sorted(set(overrides) - set(kinds))
    if unknown:
        raise ConfigError(f"unknown {group.lower()} settings {unknown}; known: {sorted(kinds)}")
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, kind in kinds.items():
        if overrides.get(name) is not None:
            values[name] = overrides[name]
            continue
        variable = f"SPARKIQ_{group}_{name.upper()}"
        raw = env.get(variable, "")
        if raw == "":
            continue
        try:
            values[name] = kind(raw)
        except ValueError:
            raise ConfigError(f"{variable}={raw!r} is not a number") from None
    return values


def dataclass_from_env(
    cls: type[T],
    group: str,
    overrides: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
) -> T:
    """``cls`` (a dataclass of int, float and str fields) from ``overrides`` and the
    ``SPARKIQ_<group>_<NAME>`` variables of ``environ`` (default ``os.environ``); its own
    checks run on the result."""
    kinds = {f.name: _PARSERS[str(f.type)] for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**values_from_env(kinds, group, overrides, environ=environ))
