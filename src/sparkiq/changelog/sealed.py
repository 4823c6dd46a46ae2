"""Sealed records: one JSON line followed by its SHA-256, for small changelog files.

Commit records and snapshot descriptors are written this way, so a torn, truncated or
altered file is detected before any of it is trusted. Positions (``{component: {partition:
offset}}``) are stored with string partition keys, as JSON requires, and read back as ints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sparkiq.errors import CorruptSegmentError

__all__ = ["position_from_json", "position_to_json", "seal", "unseal"]


def seal(doc: Mapping[str, Any]) -> bytes:
    """``doc`` as a sorted, compact JSON line, then the line's SHA-256 in hex."""
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return f"{body}\n{hashlib.sha256(body.encode()).hexdigest()}\n".encode()


def unseal(data: bytes, path: str, kind: str, newest_version: int) -> dict[str, Any]:
    """Verify and parse a sealed record of ``format == kind``.

    Raises :class:`CorruptSegmentError` naming ``path`` when the file is torn or altered, is
    another kind of record, or has a version newer than ``newest_version``.
    """
    try:
        body, digest = data.decode().rstrip("\n").split("\n")
    except (UnicodeDecodeError, ValueError):
        raise CorruptSegmentError(f"{kind} record {path!r} is truncated or garbled") from None
    if hashlib.sha256(body.encode()).hexdigest() != digest:
        raise CorruptSegmentError(f"{kind} record {path!r} fails its checksum")
    doc = json.loads(body)
    if not isinstance(doc, dict) or doc.get("format") != kind:
        raise CorruptSegmentError(f"{path!r} is not a sparkiq {kind} record")
    if int(doc.get("version", 0)) > newest_version:
        raise CorruptSegmentError(
            f"{kind} record {path!r} has format version {doc['version']}; this sparkiq reads "
            f"up to {newest_version}: upgrade sparkiq"
        )
    return doc


def position_to_json(position: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    return {c: {str(p): o for p, o in sorted(offs.items())} for c, offs in sorted(position.items())}


def position_from_json(doc: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, int]]:
    return {c: {int(p): int(o) for p, o in offs.items()} for c, offs in doc.items()}
