"""SCRAM-SHA-256 password authentication, the server's side, as Postgres speaks it.

RFC 5802 (SCRAM) with SHA-256 (RFC 7677), carried by Postgres' SASL messages: the server
offers ``AuthenticationSASL(["SCRAM-SHA-256"])``; the client answers
``SASLInitialResponse`` (client-first-message), the server ``AuthenticationSASLContinue``
(server-first-message: the nonce, salt and iteration count), the client ``SASLResponse``
(client-final-message, with its proof), and the server ``AuthenticationSASLFinal`` (its
own signature, which the client checks) before ``AuthenticationOk``. The password never
crosses the wire, and a server that does not know it cannot forge the final signature.

As in Postgres: the user name inside the SCRAM messages is ignored (the startup message
names the user), channel binding is not offered (there is no TLS to bind to: ``n`` and
``y`` are accepted, ``p=`` refused), and the password is prepared with SASLprep (RFC 4013)
when it is valid for it, as clients do, and used as is otherwise. The verifier is derived
once per server from the node's token (:meth:`ScramVerifier.from_password`, 4,096
iterations of PBKDF2-HMAC-SHA-256, Postgres' default).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stringprep
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from sparkiq.errors import ErrorCode, SparkiqError

__all__ = ["MECHANISM", "ScramError", "ScramExchange", "ScramVerifier"]

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096
_NONCE_BYTES = 18
_GS2_FLAGS = ("n", "y")  # "p=...": the client wants channel binding, which is not offered


class ScramError(SparkiqError):
    """A SCRAM message that does not follow the RFC (not a wrong password: that is
    :meth:`ScramExchange.final` answering None)."""

    code = ErrorCode.PROTOCOL_VIOLATION


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def saslprep(password: str) -> str:
    """``password`` prepared with SASLprep (RFC 4013: RFC 3454's tables, NFKC), as
    libpq prepares it; ``password`` itself when it is not valid for SASLprep (a control
    character, a prohibited or unassigned code point, bad bidirectional text), as libpq
    and the Postgres server then both use it unprepared."""
    if password.isascii() and password.isprintable():
        return password  # SASLprep changes nothing in printable ASCII
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in password if not stringprep.in_table_b1(c)
    )
    normal = unicodedata.normalize("NFKC", mapped)
    prohibited = (
        stringprep.in_table_c12,
        stringprep.in_table_c21_c22,
        stringprep.in_table_c3,
        stringprep.in_table_c4,
        stringprep.in_table_c5,
        stringprep.in_table_c6,
        stringprep.in_table_c7,
        stringprep.in_table_c8,
        stringprep.in_table_c9,
        stringprep.in_table_a1,
    )
    if not normal or any(table(c) for c in normal for table in prohibited):
        return password
    right_to_left = any(stringprep.in_table_d1(c) for c in normal)
    if right_to_left and (
        any(stringprep.in_table_d2(c) for c in normal)
        or not (stringprep.in_table_d1(normal[0]) and stringprep.in_table_d1(normal[-1]))
    ):
        return password  # mixed or badly bracketed bidirectional text
    return normal


@dataclass(frozen=True, slots=True)
class ScramVerifier:
    """What the server keeps of a password (RFC 5802's StoredKey and ServerKey), never
    the password itself."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @staticmethod
    def from_password(
        password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS
    ) -> ScramVerifier:
        salt = os.urandom(16) if salt is None else salt
        salted = hashlib.pbkdf2_hmac("sha256", saslprep(password).encode(), salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        return ScramVerifier(
            salt, iterations, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")
        )


class ScramExchange:
    """One login's exchange under ``verifiers`` -- one per valid password of the user (two
    while a token is rotated), made with the same salt and iterations, which the
    server-first-message announces: :meth:`first` then :meth:`final`, each given the
    client's message and giving the server's."""

    def __init__(
        self, verifiers: ScramVerifier | Sequence[ScramVerifier], *, nonce: str | None = None
    ) -> None:
        self.verifiers = [verifiers] if isinstance(verifiers, ScramVerifier) else list(verifiers)
        if not self.verifiers or len({(v.salt, v.iterations) for v in self.verifiers}) != 1:
            raise ValueError("SCRAM verifiers of one login share one salt and iteration count")
        self.verifier = self.verifiers[0]
        self._server_nonce = nonce or _b64(os.urandom(_NONCE_BYTES))
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def first(self, client_first: bytes) -> bytes:
        """The server-first-message answering the client-first-message."""
        text = _text(client_first)
        flag, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if flag.startswith("p="):
            raise ScramError("channel binding is not offered (there is no TLS); use n")
        if flag not in _GS2_FLAGS or authzid:
            raise ScramError("a SCRAM client-first-message starts with n,, or y,,")
        attributes = bare.split(",")
        if len(attributes) < 2 or not attributes[0].startswith("n="):
            raise ScramError("a SCRAM client-first-message names a user (n=) first")
        if not attributes[1].startswith("r=") or len(attributes[1]) < 3:
            raise ScramError("a SCRAM client-first-message has a nonce (r=) second")
        client_nonce = attributes[1][2:]
        if not all(0x21 <= ord(c) <= 0x7E for c in client_nonce):
            raise ScramError("a SCRAM nonce is printable ASCII")
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce = client_nonce + self._server_nonce
        v = self.verifier
        self._server_first = f"r={self._nonce},s={_b64(v.salt)},i={v.iterations}"
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes | None:
        """The server-final-message if the client's proof is right, None if it is wrong
        (a wrong password)."""
        if not self._server_first:
            raise ScramError("a SCRAM client-final-message came before the first")
        text = _text(client_final)
        without_proof, separator, proof_text = text.rpartition(",p=")
        if not separator:
            raise ScramError("a SCRAM client-final-message ends with its proof (p=)")
        attributes = without_proof.split(",")
        if len(attributes) < 2 or attributes[0] != "c=" + _b64(self._gs2_header.encode()):
            raise ScramError("the SCRAM channel binding (c=) does not match the first message")
        if attributes[1] != "r=" + self._nonce:
            raise ScramError("the SCRAM nonce (r=) does not match the first message")
        try:
            proof = base64.b64decode(proof_text, validate=True)
        except ValueError:
            raise ScramError("the SCRAM proof (p=) is not base64") from None
        if len(proof) != hashlib.sha256().digest_size:
            raise ScramError("the SCRAM proof (p=) has the wrong length")
        auth_message = ",".join((self._client_first_bare, self._server_first, without_proof))
        proven = None
        for v in self.verifiers:  # every one is tried: the time does not tell which matched
            signature = _hmac(v.stored_key, auth_message.encode())
            client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
            if hmac.compare_digest(hashlib.sha256(client_key).digest(), v.stored_key):
                proven = proven or v
        if proven is None:
            return None
        return f"v={_b64(_hmac(proven.server_key, auth_message.encode()))}".encode()


def _text(message: bytes) -> str:
    try:
        return bytes(message).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("a SCRAM message is UTF-8") from None
