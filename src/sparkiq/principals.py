"""Who a caller is and which tables it may read: principals, their tokens and their grants.

A node knows its principals from ``--principals FILE`` (``SPARKIQ_PRINCIPALS``), a TOML file::

    [principals.analyst]
    tokens = ["a-long-random-token"]          # any one of them authenticates (two: rotation)
    tables = ["revenue_by_product", "shop_*"] # names or shell patterns; ["*"]: every table

    [principals.dashboard]
    token_sha256 = ["<hex sha256 of the token>"]  # the file need not hold the token itself
    tables = ["revenue_by_product"]

A node started with ``--token`` alone has one principal, ``default``, reading every table.
The file is read again when it changes (looked at, at most, once a second, when a caller
authenticates), so tokens rotate without a restart: add the new token, move the clients,
remove the old one. A file that fails to load keeps the principals that were in force
(logged); one that fails at start stops the node with the reason.

The principal a request runs as travels in :data:`current` (a context variable: the pools
of :mod:`sparkiq.pools` carry it into their threads), and every read path asks
:func:`check_read` for each table it reads, so a grant holds the same on every path. In
process, with no principal set, everything is readable: code holding a :class:`~sparkiq.Node`
is trusted with it.
"""

from __future__ import annotations

import contextvars
import fnmatch
import hashlib
import hmac
import logging
import os
import threading
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass

from sparkiq.errors import AuthenticationError, ConfigError, ForbiddenError

__all__ = ["Principal", "Principals", "check_read", "current", "readable"]

log = logging.getLogger("sparkiq.principals")

#: The principal of the request running now; None: in process, unrestricted.
current: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "sparkiq_principal", default=None
)

_MAX_FILE_BYTES = 1 << 20
_LOOK_EVERY = 1.0


@dataclass(frozen=True, slots=True)
class Principal:
    """A named caller and the table patterns it may read."""

    name: str
    tables: tuple[str, ...]

    def may_read(self, table: str) -> bool:
        return any(fnmatch.fnmatchcase(table, pattern) for pattern in self.tables)


@dataclass(frozen=True, slots=True)
class _Entry:
    principal: Principal
    digests: tuple[bytes, ...]  # sha256 of each valid token


def check_read(tables: Iterable[str]) -> None:
    """Raise :class:`~sparkiq.errors.ForbiddenError` unless the current principal may read
    every one of ``tables``."""
    principal = current.get()
    if principal is None:
        return
    refused = sorted({t for t in tables if not principal.may_read(t)})
    if refused:
        raise ForbiddenError(
            f"principal {principal.name!r} may not read {', '.join(map(repr, refused))}: "
            "ask for a grant in the node's principals file"
        )


def readable(tables: Iterable[str]) -> list[str]:
    """Those of ``tables`` the current principal may read (and may know exist)."""
    principal = current.get()
    return [t for t in tables if principal is None or principal.may_read(t)]


class Principals:
    """The principals of one node (see the module docstring). Thread-safe."""

    def __init__(self, *, token: str | None = None, path: str | None = None) -> None:
        self.path = path
        self._token = token
        self._lock = threading.Lock()  # guards _entries, _plain, _stamp, _looked
        self._looked = 0.0
        # ConfigError here: the node does not start
        self._entries, self._plain, self._stamp = self._load()

    @property
    def required(self) -> bool:
        """Whether callers must authenticate (a token or a principals file is configured)."""
        return self._token is not None or self.path is not None

    def names(self) -> list[str]:
        with self._lock:
            return [e.principal.name for e in self._entries]

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal ``token`` belongs to; None when no authentication is configured.
        Raises :class:`~sparkiq.errors.AuthenticationError` for a missing or unknown
        token. Every entry's digests are compared, so the time taken does not tell which
        one matched."""
        if not self.required:
            return None
        self._reload_if_changed()
        if token is None:
            raise _refused()
        digest = hashlib.sha256(token.encode()).digest()
        with self._lock:
            entries = self._entries
        found = None
        for entry in entries:
            for candidate in entry.digests:
                if hmac.compare_digest(digest, candidate) and found is None:
                    found = entry.principal
        if found is None:
            raise _refused()
        return found

    def passwords_of(self, name: str) -> list[str]:
        """The plain tokens of principal ``name`` (a Postgres user's passwords); hashed
        ones cannot be used where the protocol needs the secret itself."""
        self._reload_if_changed()
        if name == "default" and self._token is not None:
            return [self._token]
        with self._lock:
            return list(self._plain.get(name, ()))

    def principal(self, name: str) -> Principal | None:
        with self._lock:
            return next((e.principal for e in self._entries if e.principal.name == name), None)

    # -- the file ----------------------------------------------------------------------------

    def routed_for(self, name: str | None, node_id: str) -> Principal | None:
        """The principal a member says a routed request runs for (None: the member itself,
        unrestricted); :class:`~sparkiq.errors.ForbiddenError` for a name node ``node_id``
        does not know."""
        if name is None:
            return None
        found = self.principal(name)
        if found is None:
            raise ForbiddenError(
                f"a member routed a request for principal {name!r}, which node "
                f"{node_id!r} does not know: give every node the same principals file"
            )
        return found

    def _load(self) -> tuple[list[_Entry], dict[str, tuple[str, ...]], tuple[int, int] | None]:
        """The entries, each principal's plain tokens, and the file's stamp."""
        entries: list[_Entry] = []
        plain: dict[str, tuple[str, ...]] = {}
        if self._token is not None:
            digest = hashlib.sha256(self._token.encode()).digest()
            entries.append(_Entry(Principal("default", ("*",)), (digest,)))
        if self.path is None:
            return entries, plain, None
        try:
            stat = os.stat(self.path)
            if stat.st_size > _MAX_FILE_BYTES:
                raise ConfigError(f"is larger than {_MAX_FILE_BYTES} bytes")
            with open(self.path, "rb") as handle:
                doc = tomllib.load(handle)
        except ConfigError as exc:
            raise ConfigError(f"principals file {self.path!r} {exc}") from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read the principals file {self.path!r}: {exc}") from None
        table = doc.get("principals")
        if not isinstance(table, dict) or not table:
            raise ConfigError(f"principals file {self.path!r} has no [principals.<name>] section")
        if "default" in table and self._token is not None:
            raise ConfigError(
                f"principals file {self.path!r}: 'default' is the name of --token's principal"
            )
        for name, spec in table.items():
            entries.append(self._entry(name, spec, plain))
        return entries, plain, (stat.st_mtime_ns, stat.st_size)

    def _entry(self, name: str, spec: object, plain: dict[str, tuple[str, ...]]) -> _Entry:
        where = f"principals file {self.path!r}, [principals.{name}]"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where} must be a table")
        unknown = sorted(set(spec) - {"tokens", "token_sha256", "tables"})
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown}; use tokens, token_sha256, tables")
        tokens = _strings(spec.get("tokens", []), f"{where}: tokens")
        hashed = _strings(spec.get("token_sha256", []), f"{where}: token_sha256")
        tables = _strings(spec.get("tables"), f"{where}: tables")
        if not tokens and not hashed:
            raise ConfigError(f"{where} has no tokens and no token_sha256")
        short = [t for t in tokens if len(t) < 16]
        if short:
            raise ConfigError(f"{where}: tokens must be at least 16 characters")
        digests = [hashlib.sha256(t.encode()).digest() for t in tokens]
        for text in hashed:
            try:
                digest = bytes.fromhex(text)
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise ConfigError(f"{where}: token_sha256 entries are 64 hex digits")
            digests.append(digest)
        plain[name] = tuple(tokens)
        return _Entry(Principal(name, tuple(tables)), tuple(digests))

    def _reload_if_changed(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._looked < _LOOK_EVERY:
                return
            self._looked = now
            stamp = self._stamp
        try:
            stat = os.stat(self.path)
        except OSError:
            return
        if (stat.st_mtime_ns, stat.st_size) == stamp:
            return
        try:
            entries, plain, stamp = self._load()
        except ConfigError as exc:
            log.warning("keeping the principals in force: %s", exc)
            with self._lock:
                self._stamp = (stat.st_mtime_ns, stat.st_size)  # warn once per change
            return
        with self._lock:
            self._entries, self._plain, self._stamp = entries, plain, stamp
        log.info("principals reloaded from %s: %s", self.path, self.names())


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where} must be a list of non-empty strings")
    return list(value)


def _refused() -> AuthenticationError:
    return AuthenticationError(
        "missing or wrong bearer token: send 'Authorization: Bearer <token>' with a token "
        "the node knows (--token / SPARKIQ_TOKEN, or its principals file)"
    )
