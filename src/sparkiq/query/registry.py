"""Query types by name: the one registry that the store dispatch and the wire both read.

Every query type has a name, its class name unless given another, which is how it travels
between processes. The built-in types are recorded here; a custom type is recorded by
:func:`sparkiq.register` (``stores/dispatch.py``) when its handler is registered, so one
registration makes a query type both answerable and sendable to another node. The registry
lives in the lowest layer that knows queries so that the wire (above the stores) can read it
without importing upward.

Contracts:

- A name belongs to one class. Registering another class under a taken name raises
  :class:`ValueError`, unless it is the same class defined again (same module and qualified
  name, as when a notebook cell or a test module runs twice): the new definition replaces it.
- A class has one name: registering it again without a name, or under the same name,
  changes nothing (e.g. a handler of a built-in query type for a store class of your own);
  under another name it raises :class:`ValueError`.
- Lookups never raise: an unknown name or class gives ``None``.
"""

from __future__ import annotations

import threading

from sparkiq.query.queries import KeyQuery, Query, RangeQuery, WindowKeyQuery, WindowRangeQuery
from sparkiq.query.versioned import MultiVersionedKeyQuery, VersionedKeyQuery

__all__ = ["query_type", "query_type_name", "query_type_names", "register_query_type"]

_by_name: dict[str, type[Query]] = {}
_names: dict[type[Query], str] = {}
_lock = threading.Lock()


def register_query_type(cls: type[Query], name: str | None = None) -> str:
    """Record ``cls`` under ``name`` (default: its class name) and return the name."""
    if not (isinstance(cls, type) and issubclass(cls, Query)):
        raise TypeError(f"a query type must be a subclass of sparkiq.Query, got {cls!r}")
    with _lock:
        current = _names.get(cls)
        key = name if name is not None else (current or cls.__name__)
        if not isinstance(key, str) or not key:
            raise TypeError(f"a query type's name must be a non-empty string, got {key!r}")
        if current is not None and current != key:
            raise ValueError(f"{_qualified(cls)} is already registered as {current!r}")
        taken = _by_name.get(key)
        if taken is not None and taken is not cls and not _same_definition(taken, cls):
            raise ValueError(
                f"query type name {key!r} is taken by {_qualified(taken)}; register "
                f"{_qualified(cls)} under another name: register({cls.__name__}, name=...)"
            )
        if taken is not None:
            _names.pop(taken, None)
        _by_name[key] = cls
        _names[cls] = key
    return key


def query_type(name: str) -> type[Query] | None:
    """The query class registered under ``name``."""
    return _by_name.get(name)


def query_type_name(cls: type[Query]) -> str | None:
    """The name ``cls`` is registered under."""
    return _names.get(cls)


def query_type_names() -> list[str]:
    """Every registered name, sorted (for error messages)."""
    return sorted(_by_name)


def _same_definition(a: type, b: type) -> bool:
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


for _builtin in (
    KeyQuery,
    RangeQuery,
    WindowKeyQuery,
    WindowRangeQuery,
    VersionedKeyQuery,
    MultiVersionedKeyQuery,
):
    register_query_type(_builtin)
