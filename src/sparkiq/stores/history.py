"""How far back a table's versions stay readable (``materialize(history=)``), and the error
of a read outside that window."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from sparkiq.errors import ConfigError, InvalidQueryError

__all__ = ["DEFAULT_HISTORY", "BatchOutOfHistory", "History"]


@dataclass(frozen=True, slots=True)
class History:
    """How many past batches stay readable: the last ``batches`` batches, and every batch
    that was current within the last ``seconds`` (whichever keeps more). ``History()``
    keeps only the newest batch."""

    batches: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.batches, bool) or not isinstance(self.batches, int) or self.batches < 0:
            raise ValueError(f"history batches must be an int >= 0, got {self.batches!r}")
        if not isinstance(self.seconds, int | float) or not (
            math.isfinite(self.seconds) and self.seconds >= 0
        ):
            raise ValueError(f"history seconds must be a finite number >= 0, got {self.seconds!r}")

    def to_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "seconds": self.seconds}

    @staticmethod
    def from_option(table: str, value: dt.timedelta | int | None) -> History:
        """``materialize(history=)``: a timedelta, an int number of batches, or None for the
        default; :class:`~sparkiq.errors.ConfigError` names a bad one."""
        if value is None:
            return DEFAULT_HISTORY
        try:
            if isinstance(value, dt.timedelta):
                return History(seconds=value.total_seconds())
            if isinstance(value, int) and not isinstance(value, bool):
                return History(batches=value)
            raise ValueError(f"got {type(value).__name__}")
        except ValueError as exc:
            raise ConfigError(
                f"history must be a timedelta >= 0 or an int number of batches >= 0 ({exc})",
                store=table,
            ) from None

    @staticmethod
    def from_json(doc: Any) -> History:
        if not isinstance(doc, dict):
            raise ValueError(f"history must be an object, got {doc!r}")
        return History(int(doc.get("batches", 0)), float(doc.get("seconds", 0.0)))


#: What a table keeps when ``materialize`` is not told: five minutes of batches.
DEFAULT_HISTORY = History(batches=0, seconds=300.0)


class BatchOutOfHistory(InvalidQueryError):
    """A read asked for a batch this replica no longer (or does not yet) hold."""
