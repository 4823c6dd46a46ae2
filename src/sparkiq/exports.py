"""A package's public names, each imported the first time it is used (PEP 562).

``import sparkiq`` used to import every module the package has: DuckDB, sqlglot, pyarrow,
RocksDB, uvicorn, about a CPU-second before ``sparkiq --help`` could print. A package that
lists where its names live (``_HOMES``) and hands the list to :func:`lazy_exports` loads a
module only when one of its names is first read; type checkers read the same names from an
``if TYPE_CHECKING:`` block of plain imports, which ``tests/test_package.py`` keeps equal to
``_HOMES`` and ``__all__``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, which exports each name in
    ``homes[module]`` from ``module``."""
    home_of = {name: module for module, names in homes.items() for name in names}
    namespace = sys.modules[package].__dict__  # the package runs this from its __init__

    def __getattr__(name: str) -> Any:
        module = home_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later reads find it without calling back here
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home_of})

    return __getattr__, __dir__
