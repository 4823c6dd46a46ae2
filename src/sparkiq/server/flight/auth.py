"""Who a Flight SQL call comes from: the node's principals, by bearer token or basic auth.

Drivers authenticate in one of two ways, both taken:

- ``authorization: Bearer <token>`` on every call (ADBC's ``authorization_header``, JDBC's
  ``token=``): the token is one of a principal's tokens (or the node's ``--token``).
- Basic auth (ADBC's ``username``/``password``, JDBC's ``user``/``password``): the driver
  sends ``authorization: Basic base64(user:password)`` on a ``Handshake`` and then uses the
  bearer token the server answers with. The user is the principal's name and the password
  one of its tokens; with ``--token`` alone, any user name with the token logs in as
  ``default``, as on the Postgres endpoint.

The handshake checks nothing: its answer is a bearer token that carries the credentials
back (:data:`_BASIC_BEARER`), and every call, the first one after the handshake included,
checks its credentials in :meth:`FlightAuth.principal`. That is where the caller's address
is known (pyarrow's middleware does not see it), so a wrong password is counted and slowed
per address with the node's other listeners (:mod:`sparkiq.server.auth_failures`,
``listener="flight"``) wherever it is presented. A refused call answers UNAUTHENTICATED;
a call without credentials is refused without counting (it guesses nothing).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import pyarrow.flight as flight

from sparkiq.errors import AuthenticationError
from sparkiq.principals import Principal, Principals
from sparkiq.server.auth_failures import AuthFailures, peer_of

__all__ = ["MIDDLEWARE_KEY", "FlightAuth", "HandshakeHandler", "peer_address"]

#: The key :meth:`pyarrow.flight.ServerCallContext.get_middleware` finds the headers under.
MIDDLEWARE_KEY = "sparkiq-auth"
# A bearer token the handshake hands back for basic auth: the base64 credentials it came
# with (nothing secret added: the client held them already).
_BASIC_BEARER = "sparkiq-basic."
_LISTENER = "flight"


class _CallHeaders(flight.ServerMiddleware):  # type: ignore[misc]
    """The credential header of one call, and the bearer answer of a basic handshake."""

    def __init__(self, authorization: str | None, handshake: bool) -> None:
        self.authorization = authorization
        self._handshake = handshake

    def sending_headers(self) -> dict[str, str]:
        if self._handshake and self.authorization:
            scheme, _, value = self.authorization.partition(" ")
            if scheme.lower() == "basic":
                return {"authorization": f"Bearer {_BASIC_BEARER}{value.strip()}"}
            if scheme.lower() == "bearer":
                return {"authorization": self.authorization}
        return {}


class _HeaderFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> _CallHeaders:
        values = headers.get("authorization") or headers.get("Authorization") or []
        value = values[0] if values else None
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        return _CallHeaders(value, info.method == flight.FlightMethod.HANDSHAKE)


class HandshakeHandler(flight.ServerAuthHandler):  # type: ignore[misc]
    """Answers ``Handshake`` (which pyarrow refuses without an auth handler) with no
    exchange: the answer is in the headers (see the module docstring). Every call's
    credentials are judged by :class:`FlightAuth` in the call itself."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""


class FlightAuth:
    """The principal of each call (see the module docstring). Thread-safe."""

    def __init__(self, principals: Principals, failures: AuthFailures) -> None:
        self.principals = principals
        self.failures = failures

    def middleware(self) -> dict[str, flight.ServerMiddlewareFactory]:
        return {MIDDLEWARE_KEY: _HeaderFactory()}

    def principal(self, context: Any) -> Principal | None:
        """The principal ``context``'s call runs as (None: the node asks for no
        credentials). Raises ``FlightUnauthenticatedError`` for a missing or wrong one,
        or while the caller's address is barred."""
        if not self.principals.required:
            return None
        headers = context.get_middleware(MIDDLEWARE_KEY)
        user, token = _credentials(None if headers is None else headers.authorization)
        peer = peer_of(peer_address(context.peer()))
        wait = self.failures.wait(peer, _LISTENER)
        if wait > 0:
            raise flight.FlightUnauthenticatedError(
                f"too many failed authentications from {peer}: the credentials were not "
                f"checked; retry in {wait:.1f} s"
            )
        if token is None:
            raise flight.FlightUnauthenticatedError(
                "this node needs credentials: send 'authorization: Bearer <token>', or basic "
                "auth with the principal's name as user and its token as password"
            )
        try:
            found = self.principals.authenticate(token)
        except AuthenticationError:
            found = None
        named = self.principals.path is not None  # with --token alone any user name goes
        if found is None or (named and user is not None and found.name != user):
            self.failures.failed(peer, _LISTENER)
            raise flight.FlightUnauthenticatedError(
                "wrong credentials: the token (or basic auth's password) must be the node's "
                "token, or with principals one of the user's own tokens"
            )
        self.failures.succeeded(peer)
        return found


def _credentials(header: str | None) -> tuple[str | None, str | None]:
    """``(user, token)`` of an ``authorization`` header (user None for a plain bearer)."""
    if not header:
        return None, None
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and not value.startswith(_BASIC_BEARER):
        return None, value or None
    if scheme.lower() == "bearer":
        value = value[len(_BASIC_BEARER) :]
    elif scheme.lower() != "basic":
        return None, None
    value += "=" * (-len(value) % 4)  # Go's driver sends base64 without its padding
    try:
        user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    return (user, password) if sep else (None, None)


def peer_address(peer: str | bytes) -> str:
    """The host of a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
    text = peer.decode() if isinstance(peer, bytes) else peer
    _, _, rest = text.partition(":")
    host = rest.rsplit(":", 1)[0] if rest.count(":") >= 1 else rest
    return host.strip("[]")
