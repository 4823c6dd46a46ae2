"""Node credentials: members prove they hold the cluster secret without ever sending it.

Client tokens admit clients; only the *cluster secret* (``cluster_secret``, shared by the
nodes of one cluster and by nothing else) admits a member. It never travels: each
node-protocol request carries a MAC of itself, keyed by the secret, and each heartbeat reply
carries a MAC that binds it to the request it answers. A process without the secret can
neither join (its heartbeats are refused before they are decoded) nor pass as a member when
a node contacts it (its replies fail the check and are dropped), and a node that contacts an
impostor hands it nothing reusable: a MAC of one request, for one path and body, that
expires.

Wire format (header values are ASCII; ``mac`` is lowercase hex of HMAC-SHA256 under the key
``HMAC-SHA256(b"sparkiq cluster secret v1", secret)``)::

    request:  x-sparkiq-node: v1 <node_id> <unix_ms> <nonce> <principal> <mac>
              mac = HMAC(key, "request\\n" method "\\n" path "\\n" node_id "\\n" unix_ms
                          "\\n" nonce "\\n" principal "\\n" sha256_hex(body))
    reply:    x-sparkiq-node-reply: v1 <mac>
              mac = HMAC(key, "reply\\n" <request mac> "\\n" sha256_hex(body))

``node_id`` and ``principal`` are percent-encoded (ids may hold spaces); ``principal`` is
the caller a routed request runs for (:mod:`sparkiq.principals`; ``-``: the node itself, or
an in-process caller, unrestricted), so the member applies that caller's grants too;
``nonce`` is 32 hex digits. A request
is accepted within :data:`MAX_SKEW` seconds of the receiver's clock, and each nonce once
(:class:`RequestVerifier` remembers the nonces of that window, a bounded number), so a
recorded request cannot be replayed. Node clocks must agree within ``MAX_SKEW`` (NTP).

Replies to query sub-requests are streamed and carry no MAC: a node sends sub-requests only
to members it has heard from in a verified heartbeat or heartbeat reply, and TLS protects
them in transit.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sparkiq.errors import AuthenticationError

__all__ = [
    "MAX_SKEW",
    "REPLY_HEADER",
    "REQUEST_HEADER",
    "NodeKey",
    "Opened",
    "RequestVerifier",
    "SignedRequest",
]

REQUEST_HEADER = "x-sparkiq-node"
REPLY_HEADER = "x-sparkiq-node-reply"
#: How far apart (seconds) a request's timestamp and the receiver's clock may be.
MAX_SKEW = 300.0
#: Shorter secrets are refused at configuration time: the secret is the cluster's only key.
_VERSION = "v1"
#: The most nonces remembered; past it the oldest go first (they expire in MAX_SKEW anyway).
_MAX_NONCES = 200_000


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """The header a request carries, and its MAC (which the reply's MAC is bound to)."""

    header: str
    mac: str


class NodeKey:
    """The key derived from a cluster secret; signs and checks node-protocol messages."""

    def __init__(self, secret: str) -> None:
        self._key = hmac.new(b"sparkiq cluster secret v1", secret.encode(), "sha256").digest()

    def _mac(self, *parts: str) -> str:
        return hmac.new(self._key, "\n".join(parts).encode(), "sha256").hexdigest()

    def sign_request(
        self, node_id: str, method: str, path: str, body: bytes, principal: str | None = None
    ) -> SignedRequest:
        stamp = str(int(time.time() * 1000))
        nonce = os.urandom(16).hex()
        quoted = urllib.parse.quote(node_id, safe="")
        who = "-" if principal is None else urllib.parse.quote(principal, safe="")
        mac = self._mac("request", method, path, quoted, stamp, nonce, who, _digest(body))
        return SignedRequest(f"{_VERSION} {quoted} {stamp} {nonce} {who} {mac}", mac)

    def sign_reply(self, request_mac: str, body: bytes) -> str:
        return f"{_VERSION} {self._mac('reply', request_mac, _digest(body))}"

    def check_reply(self, request: SignedRequest, header: str | None, body: bytes) -> None:
        """Raise :class:`AuthenticationError` unless ``header`` proves that whoever
        answered ``request`` with ``body`` holds the cluster secret."""
        expected = self.sign_reply(request.mac, body)
        if header is None or not hmac.compare_digest(header.encode(), expected.encode()):
            raise AuthenticationError(
                "the reply is not signed with this cluster's secret: whatever answered is not "
                "a member of this cluster (or runs with another cluster_secret)"
            )

    def open_request(self, header: str | None, method: str, path: str, body: bytes) -> Opened:
        """The parts of a request's header once its MAC checks out; raises
        :class:`AuthenticationError` otherwise (the clock and nonce checks are
        :class:`RequestVerifier`'s)."""
        fields = (header or "").split(" ")
        if len(fields) != 6 or fields[0] != _VERSION:
            raise _refused("it carries no node credential (x-sparkiq-node header)")
        _, quoted, stamp, nonce, who, mac = fields
        if (
            not stamp.isdigit()
            or len(stamp) > 16
            or len(nonce) != 32
            or len(quoted) > 512
            or len(who) > 512
        ):
            raise _refused("its node credential is malformed")
        expected = self._mac("request", method, path, quoted, stamp, nonce, who, _digest(body))
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            raise _refused("its node credential is not signed with this cluster's secret")
        principal = None if who == "-" else urllib.parse.unquote(who)
        return Opened(urllib.parse.unquote(quoted), int(stamp) / 1000.0, nonce, mac, principal)


@dataclass(frozen=True, slots=True)
class Opened:
    """A request whose node credential checked out: its sender, when it was signed, its
    nonce, its MAC (the reply's is bound to it) and the caller it runs for."""

    node_id: str
    sent_at: float
    nonce: str
    mac: str
    principal: str | None


class RequestVerifier:
    """Checks node-protocol requests: MAC, clock window and nonce reuse. Thread-safe.

    ``clock`` is this node's wall clock (seconds since the epoch); tests give a node a
    verifier whose clock is off to play a host whose clock was stepped."""

    def __init__(
        self, key: NodeKey, *, max_skew: float = MAX_SKEW, clock: Callable[[], float] = time.time
    ) -> None:
        self.key = key
        self.max_skew = max_skew
        self._clock = clock
        self._lock = threading.Lock()  # guards _seen
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when it expires

    def verify(self, header: str | None, method: str, path: str, body: bytes) -> Opened:
        """The request's sender (``.node_id``) and MAC (``.mac``, to sign the reply with);
        raises :class:`AuthenticationError` naming what is wrong."""
        opened = self.key.open_request(header, method, path, body)
        now = self._clock()
        if abs(now - opened.sent_at) > self.max_skew:
            raise _refused(
                f"its timestamp is {now - opened.sent_at:+.0f} s off this node's clock "
                f"(at most {self.max_skew:.0f} s): synchronize the nodes' clocks (NTP)"
            )
        with self._lock:
            while self._seen and (
                next(iter(self._seen.values())) < now or len(self._seen) >= _MAX_NONCES
            ):
                self._seen.popitem(last=False)
            if opened.nonce in self._seen:
                raise _refused("it replays a request this node has already seen")
            self._seen[opened.nonce] = now + 2 * self.max_skew
        return opened


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _refused(why: str) -> AuthenticationError:
    return AuthenticationError(
        f"node-protocol request refused: {why}; every node of a cluster must be started with "
        "the same cluster secret (--cluster-secret / SPARKIQ_CLUSTER_SECRET)"
    )
