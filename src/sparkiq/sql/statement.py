"""What kind of statement a SQL text is, judged the same way everywhere.

:func:`emit_changes_at` is the one judge of "is this a push query": ``Node.sql`` refuses
push queries with it, ``Node.stream`` finds the ``SELECT`` before ``EMIT CHANGES`` with it,
``POST /query`` picks NDJSON with it and ``CREATE TABLE ... AS SELECT ... EMIT CHANGES``
drops the clause with it. :func:`first_word` gives a statement's leading keyword.

The rules, for every caller:

* A push query's last two words are ``EMIT`` and ``CHANGES``, in any case, separated by any
  whitespace (spaces, tabs, newlines) and comments, and followed only by whitespace,
  comments and semicolons.
* Words inside comments (``-- ...`` to the end of the line, ``/* ... */``), string literals
  (``'...'``, a quote doubled inside) and quoted identifiers (``"..."``, ```...```) are not
  words of the statement. A literal or comment left open runs to the end of the text, where
  the SQL parser then reports it.

Cost is linear in the text's length and nothing backtracks: statements come from the
network, and a hostile one of megabytes (of spaces, quotes, comment openers) is judged in
milliseconds.
"""

from __future__ import annotations

import re

__all__ = ["emit_changes_at", "first_word", "is_push_query"]

_OPENER = re.compile(r"--|/\*|['\"`]")
_TRAILER = " \t\n\r\f\v;"  # what may follow EMIT CHANGES, once comments are blanked
_FIRST = re.compile(r"\s*(\w+)")
_OPAQUE = "#"  # stands for a character inside a literal: not a word, not a space


def _masked(text: str) -> str:
    """``text`` with comments blanked to spaces and quoted literals and identifiers filled
    with ``#``, the same length, so that offsets into it are offsets into ``text``."""
    if "--" not in text and "/*" not in text and not any(q in text for q in "'\"`"):
        return text
    pieces: list[str] = []
    pos, size = 0, len(text)
    while True:
        found = _OPENER.search(text, pos)
        if found is None:
            break
        start, opener = found.start(), found.group()
        pieces.append(text[pos:start])
        end = _end_of(text, start, opener)
        if end < 0:  # left open: opaque to the end, so nothing after it is a word
            pieces.append(_OPAQUE * (size - start))
            pos = size
            break
        fill = " " if opener in ("--", "/*") else _OPAQUE
        pieces.append(fill * (end - start))
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces)


def _end_of(text: str, start: int, opener: str) -> int:
    """Where the comment or quoted span opened at ``start`` ends (exclusive); -1: never."""
    if opener == "--":
        end = text.find("\n", start)
        return len(text) if end < 0 else end
    if opener == "/*":
        end = text.find("*/", start + 2)
        return -1 if end < 0 else end + 2
    at = start + 1
    while True:  # each find starts past the last one: linear however many quotes
        close = text.find(opener, at)
        if close < 0:
            return -1
        if not text.startswith(opener, close + 1):
            return close + 1
        at = close + 2  # a doubled quote stands for one quote inside the literal


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char in "_$"


def _word_ending_at(masked_text: str, end: int, word: str) -> bool:
    start = end - len(word)
    if start < 0:
        return False
    found = masked_text[start:end]
    if not (found.isascii() and found.upper() == word):
        return False
    return start == 0 or not _is_word_char(masked_text[start - 1])


def emit_changes_at(text: str) -> int | None:
    """The offset of the ``EMIT`` of a trailing ``EMIT CHANGES`` clause, or None when
    ``text`` is not a push query (see the module docstring for the rules).

    ``text[:offset]`` is the statement without the clause."""
    ending = text.rstrip(_TRAILER)[-7:]
    plain = "--" not in text and "/*" not in text  # then the raw ending is the masked one
    if plain and not (ending.isascii() and ending.upper() == "CHANGES"):
        return None
    blanked = _masked(text)
    end = len(blanked.rstrip(_TRAILER))
    if not _word_ending_at(blanked, end, "CHANGES"):
        return None
    start = end - len("CHANGES")
    before = len(blanked[:start].rstrip())
    if before == start or not _word_ending_at(blanked, before, "EMIT"):
        return None
    return before - len("EMIT")


def is_push_query(text: str) -> bool:
    """True when ``text`` ends in ``EMIT CHANGES`` (a push query; run it with ``stream()``)."""
    return emit_changes_at(text) is not None


def first_word(text: str) -> tuple[str, int] | None:
    """The statement's first word, upper-cased, and the offset just after it, skipping
    whitespace and comments; None when it starts with anything else (a literal, a symbol)
    or is empty."""
    found = _FIRST.match(_masked(text))
    if found is None:
        return None
    return found.group(1).upper(), found.end()
