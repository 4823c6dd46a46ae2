"""Error messages made fit for a caller: no filesystem paths, storage URIs or Python
internals (the REST API's errors, partition failures in streamed results, push query
errors all pass through :func:`scrub`)."""

from __future__ import annotations

import os
import re

__all__ = ["roots_of", "scrub"]

# An absolute path (with at least two segments, not one of this API's routes), a Windows
# path, or a storage URI (s3://, file://, ...; not http(s), which name nodes), each up to
# whitespace, a quote or punctuation that ends it.
_PATH = re.compile(
    r"""(?:\b(?!https?://)[a-z][a-z0-9+.-]*://
         | \b[A-Za-z]:\\
         | (?<![\w/.:])/(?!(?:stores|internal|metadata|query|openapi)\b)(?=[^\s'"]*/)
        )[^\s'",;()\]\[]*""",
    re.VERBOSE | re.IGNORECASE,
)
# Python's own words: class reprs, module-qualified names of our libraries, dunder calls
_PYTHON = re.compile(
    r"""<class\s+'[^']*'>
      | \b(?:sqlglot|sparkiq|duckdb|pyarrow|msgspec|orjson|rocksdict|builtins|uvicorn)(?:\.\w+)+
      | \b\w+\.__\w+__\(\)\s*""",
    re.VERBOSE,
)


def roots_of(*directories: object) -> tuple[str, ...]:
    """The local directories among ``directories``, as given and absolute, longest first:
    what :func:`scrub` removes even where a message names them relatively."""
    found = set()
    for directory in directories:
        if isinstance(directory, str) and directory and "://" not in directory:
            found |= {directory.rstrip("/"), os.path.abspath(directory)}
    return tuple(sorted((d for d in found if len(d) > 1), key=len, reverse=True))


def scrub(message: str, roots: tuple[str, ...] = ()) -> str:
    """``message`` without filesystem paths, storage URIs or Python internals, for a caller.

    Paths under ``roots`` (the state and local directories, relative or not) and every
    absolute path or URI become ``<path>``; class reprs and module-qualified names become
    ``a value``; a traceback is cut off. What the message says about tables, columns and
    partitions stays."""
    if "Traceback" in message:
        message = message[: message.index("Traceback")].rstrip() or "internal error"
    for root in roots:
        if root in message:
            # A relative root ("state") is a path only where one starts, and only as a whole
            # segment: as a bare substring it would eat words ("INSERT statements" became
            # "INSERT <path> are not allowed").
            start = "" if root.startswith("/") else r"(?<![\w/.-])"
            end = r"(?![\w.-])" if root.startswith("/") else r"(?=/)"
            pattern = start + re.escape(root) + end + r"[^\s'\",;()]*"
            message = re.sub(pattern, "<path>", message)
    message = _PATH.sub("<path>", message)
    return _PYTHON.sub(_python_word, message)


def _python_word(match: re.Match[str]) -> str:
    return "" if "__" in match.group() else "a value"
