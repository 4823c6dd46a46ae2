"""One execution of a statement (:class:`Reading`): the batch it reads each table at, the
position it read at, and its page; and page tokens: where the next page starts, and how
fresh it must be.

Token format 1: ``"sq1."`` + URL-safe base64 (no padding) of compact JSON::

    {"v": 1, "h": statement digest, "m": "key" | "offset", "k": last store key (hex) | null,
     "n": rows returned so far, "p": position token, "b": {table: batch} (offset mode)}

- ``key`` mode (single-table queries without ORDER BY, aggregates or DISTINCT): rows come in
  key order and the next page starts strictly after the last key returned. Every key
  appears at most once across the pages, and a key present during the whole paging
  appears exactly once.
- ``offset`` mode (everything else): the statement runs again and skips the rows already
  returned, reading every table at the batch the first page read it at (``b``, as ``AS OF``
  would), so that all pages are cut from one state even while the tables change. A page
  whose batch left a table's history fails like any ``AS OF`` past it. (A token without
  ``b``, from a node before pinning, pins nothing.)

In both modes each next page is read at a position at least as fresh as the previous
page's (the token's position is the page's position bound).

Every execution path of the engine (a lookup answered in Python, one DuckDB query over whole
tables, per-partition fragments) reads through one :class:`Reading`: it says at which batch
to read a table reference (its ``AS OF``; else the batch the statement already read that
table at, so a self-join reads one state; else, for an offset page, the first page's) and
keeps what each read served, then writes the next page's token.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sparkiq.error_codes import ErrorCode
from sparkiq.query.position import Position
from sparkiq.sql.errors import SqlError

__all__ = ["PageToken", "Reading"]

_PREFIX = "sq1."


@dataclass(frozen=True, slots=True)
class PageToken:
    """A decoded page token (see the module docstring)."""

    digest: str
    mode: str
    last_key: bytes | None
    returned: int
    position: Position
    #: offset mode: the batch each table was read at, which later pages read it at too
    batches: Mapping[str, int] = field(default_factory=dict)

    def encode(self) -> str:
        doc = {
            "v": 1,
            "h": self.digest,
            "m": self.mode,
            "k": None if self.last_key is None else self.last_key.hex(),
            "n": self.returned,
            "p": self.position.to_token(),
        }
        if self.batches:
            doc["b"] = dict(self.batches)
        raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        return _PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    @staticmethod
    def decode(token: str, digest: str) -> PageToken:
        """Parse a token of the statement with ``digest``; SqlError if it is not one."""
        if not isinstance(token, str) or not token.startswith(_PREFIX):
            raise _bad(f"not a sparkiq SQL page token: {token!r:.60}")
        body = token[len(_PREFIX) :]
        try:
            doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            batches = doc.get("b", {})
            if not isinstance(batches, dict) or not all(
                isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in batches.values()
            ):
                raise ValueError(f"batches {batches!r:.60}")
            parsed = PageToken(
                str(doc["h"]),
                str(doc["m"]),
                None if doc["k"] is None else bytes.fromhex(doc["k"]),
                int(doc["n"]),
                Position.from_token(doc["p"]),
                {str(t): b for t, b in batches.items()},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise _bad(f"corrupted page token {token!r:.60}: {exc}") from None
        if parsed.digest != digest:
            raise _bad(
                "the page token belongs to another statement; pass the same SQL text that "
                "returned it"
            )
        if parsed.mode not in ("key", "offset") or parsed.returned < 0:
            raise _bad(f"corrupted page token {token!r:.60}")
        return parsed


class Reading:
    """One execution of a statement (see the module docstring). ``as_of`` gives the batch
    a table reference's ``AS OF`` names (None: it has none). With ``pin=False`` (key-mode
    pages, which read the newest batch) only ``AS OF`` pins a table."""

    __slots__ = ("_as_of", "batches", "digest", "page_size", "position", "token")

    def __init__(
        self,
        digest: str,
        token: PageToken | None,
        page_size: int | None,
        as_of: Callable[[str, object], int | None],
        *,
        pin: bool = True,
    ) -> None:
        self.digest = digest
        self.token = token
        self.page_size = page_size
        self._as_of = as_of
        #: table -> the batch this statement reads it at (an offset page: the first page's)
        self.batches: dict[str, int] = (
            dict(token.batches) if pin and token is not None and token.mode == "offset" else {}
        )
        #: the merge of what every read served
        self.position = Position.empty()

    @property
    def offset(self) -> int:
        """Rows earlier pages returned."""
        return self.token.returned if self.token is not None else 0

    def at_batch(self, table: str, as_of: object) -> int | None:
        """The batch to read table ``table`` (a reference with ``AS OF`` value ``as_of``,
        None: none) at; None lets the source pick one, which :meth:`served` then keeps."""
        if as_of is not None:
            return self._as_of(table, as_of)
        return self.batches.get(table)

    def served(self, table: str, as_of: object, position: Position, batch: int | None) -> None:
        """Record a read of ``table`` served at ``position`` (``batch``: the table's batch
        there, None: no partition answered)."""
        self.position = self.position.merge(position)
        if batch is not None and as_of is None:
            self.batches.setdefault(table, batch)

    def saved(self) -> tuple[dict[str, int], Position]:
        """What has been read so far, for :meth:`restore` (an attempt given up on)."""
        return dict(self.batches), self.position

    def restore(self, saved: tuple[dict[str, int], Position]) -> None:
        self.batches, self.position = dict(saved[0]), saved[1]

    def result_position(self) -> Position:
        """The position the result was read at: every read's, and no older than the
        previous page's."""
        if self.token is None:
            return self.position
        return self.position.merge(self.token.position)

    def next_offset_token(self, returned: int) -> str:
        """The token of the page after one of ``returned`` rows (offset mode)."""
        position = self.result_position()
        total = self.offset + returned
        return PageToken(self.digest, "offset", None, total, position, self.batches).encode()


def _bad(message: str) -> SqlError:
    return SqlError(message, code=ErrorCode.BAD_PAGE_TOKEN, field="page_token")
