"""A table's key lookup path, compiled once per table: validate, partition and encode a key
in one call, each step done once.

Every key lookup needs the same three facts about a user's key: its internal values (the
validation of :class:`~sparkiq.schema.keycodec.KeyCodec`), its partition
(:class:`~sparkiq.schema.partitioner.Partitioner`) and its encoded bytes (what the store is
asked for). :func:`key_locator` builds, once per table, a function answering all three, so a
request locates its key once and hands the result down (the read, the routing and the
answer reuse it; nothing is validated, hashed or encoded twice).

The common key -- one ASCII string for a one-string-column table -- gets a path of its own
(no validator chain; the partitioner has a fast path of its own for it), and a composite key
given as a tuple one with its columns' steps unrolled.
Every other key (and any value the fast path does not take: a ``str`` subclass, non-ASCII,
None) goes through the codec's validation, so bad keys meet exactly the errors they always
did. The two paths give identical results
(``tests/schema/test_keypath.py`` checks them against each other).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkiq.schema.keycodec import KeyCodec, encode_utf8_key
from sparkiq.schema.partitioner import Partitioner

__all__ = ["KeyLocator", "key_locator"]

#: ``key -> (internal values, partition, encoded key)``; raises
#: :class:`~sparkiq.errors.InvalidQueryError` for a key the table's key columns refuse.
KeyLocator = Callable[[Any], tuple[tuple[Any, ...], int, bytes]]


def key_locator(codec: KeyCodec, partitioner: Partitioner) -> KeyLocator:
    """The lookup path of one table's keys (see the module docstring). Thread-safe: it
    holds only the immutable codec and partitioner."""
    to_internal, encode, partition_of = codec.to_internal, codec.encode, partitioner

    def locate(key: Any) -> tuple[tuple[Any, ...], int, bytes]:
        internal = to_internal(key)
        return internal, partition_of(internal), encode(internal)

    types = partitioner.types
    if codec.windowed:
        return locate
    if len(types) > 1:
        return _composite_locator(codec, partitioner, locate)
    if types[0].name != "string":
        return locate

    def locate_string(key: Any) -> tuple[tuple[Any, ...], int, bytes]:
        # An ASCII str is valid as it is (no lone surrogates): skip the validator's chain.
        if key.__class__ is not str or not key.isascii():
            return locate(key)
        internal = (key,)
        return internal, partition_of(internal), encode_utf8_key(key.encode())

    return locate_string


def _composite_locator(
    codec: KeyCodec, partitioner: Partitioner, general: KeyLocator
) -> KeyLocator:
    """The path of a composite key given as a tuple of the right length, with the columns'
    steps unrolled: no per-column loop, zip or list (the commonest composite lookups pay
    for little else). The function is generated once per table; only indexes enter its
    source. A list, a tuple of another length or anything else takes ``general``."""
    steps = codec.column_steps
    width = len(steps)
    values = ", ".join(f"v{i}" for i in range(width))
    lines = [
        "def locate_composite(key):",
        f"    if key.__class__ is not tuple or len(key) != {width}:",
        "        return general(key)",
        f"    {values}, = key",
        *(f"    i{i} = check{i}(v{i})" for i in range(width)),
        f"    internal = ({', '.join(f'i{i}' for i in range(width))},)",
        "    return internal, partition_of(internal), "
        + " + ".join(f"encode{i}(i{i})" for i in range(width)),
    ]
    scope: dict[str, Any] = {"general": general, "partition_of": partitioner}
    for i, (check, encode) in enumerate(steps):
        scope[f"check{i}"], scope[f"encode{i}"] = check, encode
    exec("\n".join(lines), scope)  # the source holds indexes only
    built: KeyLocator = scope["locate_composite"]
    return built
