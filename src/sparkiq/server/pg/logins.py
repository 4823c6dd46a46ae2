"""Postgres users are the node's principals: who may log in, with which passwords, as whom.

With a principals file (:mod:`sparkiq.principals`) a Postgres user is a principal's name and
its passwords are the principal's plain tokens (a principal known only by hashed tokens
cannot log in over Postgres: SCRAM needs the secret itself). With ``--token`` alone every
user name logs in as principal ``default`` with the token, as before principals existed. A
user the node does not know still gets a SCRAM exchange, against a password nobody has, so
the answer does not tell which users exist.

Verifiers (PBKDF2, a few milliseconds each) are made once per user and password and kept
while the password stays valid; one salt per user, so the passwords of a rotation can be
offered in one exchange.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from pygwire import messages as m

from sparkiq.errors import AuthenticationError
from sparkiq.principals import Principal, Principals
from sparkiq.server.auth_failures import AuthFailures
from sparkiq.server.pg.errors import error_fields, fatal_fields
from sparkiq.server.pg.scram import MECHANISM, ScramError, ScramExchange, ScramVerifier

__all__ = ["PgLogins", "password_exchange"]

_NOBODY = os.urandom(32).hex()  # the password of users that do not exist


class PgLogins:
    """Who may log in to the Postgres endpoint (see the module docstring). Thread-safe."""

    def __init__(self, principals: Principals) -> None:
        self.principals = principals
        self._lock = threading.Lock()  # guards _salts and _verifiers
        self._salts: dict[str, bytes] = {}
        self._verifiers: dict[tuple[str, str], ScramVerifier] = {}

    @property
    def required(self) -> bool:
        return self.principals.required

    def login(self, user: str) -> tuple[Principal | None, list[ScramVerifier]]:
        """The principal ``user`` logs in as (None: not a user) and the verifiers of its
        passwords (one of a password nobody has when it has none)."""
        name = user if self.principals.path is not None else "default"
        principal = self.principals.principal(name)
        passwords = self.principals.passwords_of(name) if principal is not None else []
        if not passwords:
            return None, [self._verifier(user, _NOBODY)]
        return principal, [self._verifier(name, p) for p in passwords]

    def _verifier(self, name: str, password: str) -> ScramVerifier:
        with self._lock:
            found = self._verifiers.get((name, password))
            salt = self._salts.setdefault(name, os.urandom(16))
        if found is not None:
            return found
        made = ScramVerifier.from_password(password, salt=salt)  # outside the lock: slow
        with self._lock:
            if len(self._verifiers) > 4096:  # passwords rotated away: start over
                self._verifiers.clear()
            return self._verifiers.setdefault((name, password), made)


def password_exchange(
    verifiers: list[ScramVerifier],
    messages: Iterator[Any],
    say: Callable[[Any, bool], None],
    failures: AuthFailures,
    peer: str,
    user: str,
) -> bool | None:
    """The SCRAM-SHA-256 exchange (see :mod:`~sparkiq.server.pg.scram`), its verdict
    reported to ``AuthFailures``: True if the client proved it knows the password,
    False if it did not (the error sent), None if the exchange broke off (a malformed
    message, answered with 08P01, is no guess at the password). ``say(message, flush)``
    sends a message to the client of ``messages`` (``peer``, logging in as ``user``)."""
    exchange = ScramExchange(verifiers)
    say(m.AuthenticationSASL(mechanisms=[MECHANISM]), True)
    try:
        first = next(messages)
        if not isinstance(first, m.SASLInitialResponse) or first.mechanism != MECHANISM:
            raise ScramError(f"the server asked for {MECHANISM} authentication")
        say(m.AuthenticationSASLContinue(data=exchange.first(first.data)), True)
        final = next(messages)
        if not isinstance(final, m.SASLResponse):
            raise ScramError("a SCRAM client-final-message (SASLResponse) was expected")
        signature = exchange.final(final.data)
    except ScramError as exc:
        # 08P01 protocol_violation, as Postgres answers a malformed SCRAM message: not
        # a guess at the password, so not counted as a failure.
        say(m.ErrorResponse(fields=fatal_fields(exc.code.sqlstate, exc.message)), False)
        return None
    if signature is None:
        failures.failed(peer, "pg", admitted=True)
        fields = error_fields(AuthenticationError("x"))
        fields.update(
            S="FATAL",
            V="FATAL",
            M=f'password authentication failed for user "{user}" (the password is '
            "the node's token, or with principals one of the user's own tokens)",
        )
        say(m.ErrorResponse(fields=fields), False)
        return False
    failures.succeeded(peer)
    say(m.AuthenticationSASLFinal(data=signature), False)
    return True
