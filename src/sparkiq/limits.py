"""What a node's listeners accept: :class:`HttpLimits`, :class:`PgLimits`, :class:`AuthPolicy`.

Plain settings, one frozen dataclass per group, each field set by a keyword argument or a
``SPARKIQ_<GROUP>_<NAME>`` variable. :class:`~sparkiq.serving.config.NodeConfig` resolves
them (with the SQL engine's :class:`~sparkiq.sql.SqlLimits`) once per node and hands them to
the listeners that enforce them: the HTTP runner (:mod:`sparkiq.server.runner`), the Postgres
endpoint (:mod:`sparkiq.server.pg`) and the failed-authentication counter
(:mod:`sparkiq.server.auth_failures`). They live in this bottom layer, not beside their
enforcers in ``server``, because the configuration (``cluster``) sits below the server and
may not import it; ``SqlLimits`` stays in ``sql``, which is already below ``cluster``, next
to the statement checks it makes (docs/design.md, "every node setting in NodeConfig").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from sparkiq.errors import ConfigError

__all__ = ["AuthPolicy", "HttpLimits", "PgLimits", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|[kmgt]i?b)?\s*$", re.IGNORECASE)
_UNIT = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNIT |= {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str, name: str = "size") -> int:
    """Bytes of a DuckDB-style size setting (``"512MB"``, ``"1GiB"``, ``"4096"``, as
    ``SqlLimits.memory_limit``); ConfigError naming ``name`` else."""
    found = _SIZE.match(text) if isinstance(text, str) else None
    if found is None:
        raise ConfigError(f"{name} must be a size like '512MB' or '1GiB', got {text!r}")
    return int(float(found.group(1)) * _UNIT[(found.group(2) or "b").lower()])


def _positive(group: object, name: str) -> None:
    """Every field of ``group`` a number > 0 (``name``: the class, for the message)."""
    for f in fields(group):  # type: ignore[arg-type]
        value = getattr(group, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{name}.{f.name} must be a number > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one node's HTTP server accepts from a client (enforced as described in
    :mod:`sparkiq.server.runner`). Variables: ``SPARKIQ_HTTP_<NAME>``, e.g.
    ``SPARKIQ_HTTP_HEADER_TIMEOUT=5``.

    - ``max_header_bytes``: bytes from a request's first byte to the end of its headers
      (``431`` beyond).
    - ``header_timeout`` / ``body_timeout``: seconds for the headers, then for the body
      (``408`` beyond).
    - ``max_body_bytes``: the largest request body (``413``).
    - ``max_connections``: connections open at once (``503`` beyond).
    - ``keep_alive_timeout``: seconds an idle keep-alive connection stays open.
    """

    max_header_bytes: int = 64 * 1024
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_body_bytes: int = 1 << 20
    max_connections: int = 1000
    keep_alive_timeout: float = 30.0

    def __post_init__(self) -> None:
        _positive(self, "HttpLimits")


@dataclass(frozen=True, slots=True)
class PgLimits:
    """What one Postgres client may cost the endpoint, before and after it logs in
    (:class:`~sparkiq.server.pg.PgServer`). Variables: ``SPARKIQ_PG_<NAME>``, e.g.
    ``SPARKIQ_PG_STARTUP_TIMEOUT=5``. Statement text, once bound, is also held to
    :class:`~sparkiq.sql.SqlLimits` (``max_statement_chars`` bounds a bound statement's size).

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
        _positive(self, "PgLimits")
        if self.max_unauthenticated > self.max_connections:
            raise ConfigError(
                f"PgLimits.max_unauthenticated ({self.max_unauthenticated}) exceeds "
                f"max_connections ({self.max_connections})"
            )


@dataclass(frozen=True, slots=True)
class AuthPolicy:
    """How a node slows callers whose credentials fail (every listener: REST tokens,
    Postgres passwords; see :mod:`sparkiq.server.auth_failures`). Variables:
    ``SPARKIQ_AUTH_<NAME>``, e.g. ``SPARKIQ_AUTH_MAX_DELAY=30``.

    - ``free_failures``: failures in a row that cost nothing (typos).
    - ``base_delay`` / ``max_delay``: past those, each failure bars the peer for
      ``base_delay`` seconds, doubling with each further failure up to ``max_delay``.
    - ``forget_seconds``: a peer with no failure this long is forgotten.
    - ``max_peers``: peers remembered at once.
    """

    free_failures: int = 3
    base_delay: float = 0.25
    max_delay: float = 5.0
    forget_seconds: float = 600.0
    max_peers: int = 4096

    def __post_init__(self) -> None:
        numbers = (self.free_failures, self.base_delay, self.max_delay, self.forget_seconds)
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in numbers) or not (
            self.free_failures >= 0
            and 0 < self.base_delay <= self.max_delay
            and self.forget_seconds > 0
        ):
            raise ConfigError(
                "AuthPolicy needs free_failures >= 0, 0 < base_delay <= max_delay and "
                f"forget_seconds > 0; got {self.free_failures}, {self.base_delay}, "
                f"{self.max_delay}, {self.forget_seconds}"
            )
        if (
            isinstance(self.max_peers, bool)
            or not isinstance(self.max_peers, int)
            or (self.max_peers < 1)
        ):
            raise ConfigError(f"AuthPolicy.max_peers must be an int >= 1, got {self.max_peers!r}")
