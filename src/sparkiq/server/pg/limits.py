"""What one Postgres client may cost the endpoint, before and after it logs in.

Every field has a ``SPARKIQ_PG_<NAME>`` environment variable (:meth:`PgLimits.from_env`),
e.g. ``SPARKIQ_PG_STARTUP_TIMEOUT=5``. Statement text, once bound, is also held to
:class:`~sparkiq.sql.SqlLimits` (``max_statement_chars`` bounds a bound statement's size).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sparkiq.envsettings import dataclass_from_env
from sparkiq.errors import ConfigError

__all__ = ["PgLimits"]


@dataclass(frozen=True, slots=True)
class PgLimits:
    """Limits of one :class:`~sparkiq.server.pg.PgServer`.

    - ``max_connections``: open connections, logged in or not; one more is refused with
      SQLSTATE 53300.
    - ``max_unauthenticated``: connections that have not finished logging in. A new
      connection over it takes the slot of the oldest one that has been logging in for
      ``eviction_seconds`` or more (that one is closed); with none that old, the new one is
      refused (53300). Connections already logged in are never affected, so a flood of
      half-open connections can neither hold every slot nor keep real clients out.
    - ``eviction_seconds``: how long a connection may log in before a newer one may take
      its slot (real clients log in within milliseconds).
    - ``startup_timeout``: seconds from accepting a connection to the end of its login,
      however the client spreads its bytes (a deadline for the whole exchange, not for
      each read).
    - ``max_startup_bytes``: most bytes a client may send before it is logged in.
    - ``max_parameters``: most values one ``Bind`` may carry (Postgres allows 65,535).
    - ``max_parameter_chars``: longest SQL literal one parameter value may become.
    - ``max_numeric_digits``: most digits before, and most after, the decimal point of a
      binary ``numeric`` parameter (1,000, Postgres' largest declared precision).
    """

    max_connections: int = 64
    max_unauthenticated: int = 32
    eviction_seconds: float = 1.0
    startup_timeout: float = 10.0
    max_startup_bytes: int = 16 << 10
    max_parameters: int = 10_000
    max_parameter_chars: int = 64 << 10
    max_numeric_digits: int = 1000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"PgLimits.{f.name} must be a number > 0, got {value!r}")
        if self.max_unauthenticated > self.max_connections:
            raise ConfigError(
                f"PgLimits.max_unauthenticated ({self.max_unauthenticated}) exceeds "
                f"max_connections ({self.max_connections})"
            )

    @staticmethod
    def from_env(**overrides: object) -> PgLimits:
        """Keyword arguments first, then ``SPARKIQ_PG_<NAME>`` variables, then
        defaults (:mod:`sparkiq.envsettings`)."""
        return dataclass_from_env(PgLimits, "PG", overrides)
