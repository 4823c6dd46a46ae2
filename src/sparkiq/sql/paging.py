"""Page tokens: where the next page of a statement starts, and how fresh it must be.

Token format 1: ``"sq1."`` + URL-safe base64 (no padding) of compact JSON::

    {"v": 1, "h": statement digest, "m": "key" | "offset", "k": last store key (hex) | null,
     "n": rows returned so far, "p": position token}

- ``key`` mode (single-table queries without ORDER BY, aggregates or DISTINCT): rows come in
  key order and the next page starts strictly after the last key returned. Every key
  appears at most once across the pages, and a key present during the whole paging
  appears exactly once.
- ``offset`` mode (everything else): the statement runs again and skips the rows already
  returned. It is exact when the table did not change between pages; otherwise rows may
  shift between pages.

In both modes each next page is read at a position at least as fresh as the previous
page's (the token's position is the page's position bound).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from sparkiq.query.position import Position
from sparkiq.sql.errors import SqlError

__all__ = ["PageToken"]

_PREFIX = "sq1."


@dataclass(frozen=True, slots=True)
class PageToken:
    """A decoded page token (see the module docstring)."""

    digest: str
    mode: str
    last_key: bytes | None
    returned: int
    position: Position

    def encode(self) -> str:
        doc = {
            "v": 1,
            "h": self.digest,
            "m": self.mode,
            "k": None if self.last_key is None else self.last_key.hex(),
            "n": self.returned,
            "p": self.position.to_token(),
        }
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
            parsed = PageToken(
                str(doc["h"]),
                str(doc["m"]),
                None if doc["k"] is None else bytes.fromhex(doc["k"]),
                int(doc["n"]),
                Position.from_token(doc["p"]),
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


def _bad(message: str) -> SqlError:
    return SqlError(message, code="bad_page_token", field="page_token")
