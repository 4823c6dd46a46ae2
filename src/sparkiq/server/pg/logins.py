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

from sparkiq.principals import Principal, Principals
from sparkiq.server.pg.scram import ScramVerifier

__all__ = ["PgLogins"]

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
