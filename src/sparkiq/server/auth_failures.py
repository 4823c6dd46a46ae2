"""Failed authentications of one node: counted by listener, and slowed per peer address.

Every listener that checks a credential reports here: the REST API (a bearer token that was
presented and is wrong; a request without one is refused without counting, as it guesses
nothing), the Postgres endpoint (a wrong password) and the Flight SQL endpoint (a wrong
bearer token or basic-auth password).

The policy, per peer (an IPv4 address, or the /64 network of an IPv6 one, which a single
host commonly owns whole):

- ``free_failures`` failures in a row cost nothing (typos).
- Past those, each failure bars the peer for ``base_delay`` seconds, doubling with each
  further failure up to ``max_delay``.
- An attempt from a barred peer is refused at once, before its credential is looked at,
  saying how long to wait. Nothing waits inside the server, so no thread or task is held
  per attacker (HTTP answers 401 with ``retry_after_seconds``, Postgres SQLSTATE 28000),
  and since a barred peer's guesses are never checked, a throttled peer gets
  one checked guess per ``max_delay`` seconds at most, however many connections it opens.
- Attempts in flight count as failures until their verdict: a Postgres login takes round
  trips between admission (:meth:`AuthFailures.admit`) and verdict, so without that an
  attacker opening many connections at once would have them all checked before the first
  failure. (An HTTP token is judged on the event loop right after :meth:`AuthFailures.wait`,
  with nothing in between, so HTTP needs no reservation.)
- A success resets the peer (so a shared address, a NAT, is only slowed while its
  failures go on). A peer with no failure for ``forget_seconds`` is forgotten; at most
  ``max_peers`` are remembered (the one whose bar ended first makes room).

The settings are an :class:`~sparkiq.limits.AuthPolicy`, a node's ``auth_policy`` (keyword
argument, then ``SPARKIQ_AUTH_<NAME>`` variables, resolved by
:class:`~sparkiq.serving.config.NodeConfig`). The counts are Prometheus counters (:meth:`collect`):
``sparkiq_auth_failures_total{listener}`` (credentials checked and wrong) and
``sparkiq_auth_throttled_total{listener}`` (attempts refused while barred).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, Metric

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import AuthenticationError
from sparkiq.limits import AuthPolicy
from sparkiq.server.http_errors import HttpError

__all__ = ["AuthFailures", "auth_failures_of", "peer_of"]

LISTENERS = ("http", "pg", "flight")
T = TypeVar("T")


@dataclass
class _Peer:
    failures: int  # in a row
    barred_until: float  # clock time; <= now: may try
    last_failure: float
    pending: int = 0  # attempts admitted (admit) whose verdict has not come yet


@lru_cache(maxsize=4096)
def peer_of(host: str | None) -> str:
    """The key failures of ``host`` (an address as a socket gives it) are counted under
    (remembered for the last few thousand hosts: parsing an address costs microseconds, and
    the same clients call again and again)."""
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class AuthFailures:
    """Failed authentications, shared by every listener of one node (thread-safe: ``_lock``
    guards ``_peers`` and the counters; it is held for a dict update only, also on the
    HTTP event loop)."""

    def __init__(
        self, policy: AuthPolicy | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        #: The policy (a node's ``auth_policy``; default: :class:`~sparkiq.limits.AuthPolicy`).
        self.policy = policy = AuthPolicy() if policy is None else policy
        self.free_failures = policy.free_failures
        self.base_delay = policy.base_delay
        self.max_delay = policy.max_delay
        self.forget_seconds = policy.forget_seconds
        self.max_peers = policy.max_peers
        self._clock = clock
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._failures = dict.fromkeys(LISTENERS, 0)
        self._throttled = dict.fromkeys(LISTENERS, 0)

    # -- the policy --------------------------------------------------------------------------

    def wait(self, peer: str, listener: str) -> float:
        """Seconds ``peer`` must still wait before its credential is checked (0: now). A
        positive answer counts as a throttled attempt of ``listener``."""
        if peer not in self._peers:  # the common case, without the lock (a dict read)
            return 0.0
        now = self._clock()
        with self._lock:
            state = self._peers.get(peer)
            if state is None or state.barred_until <= now:
                return 0.0
            self._throttled[listener] += 1
            return state.barred_until - now

    def admit(self, peer: str, listener: str) -> float:
        """Like :meth:`wait`, for a check that does not follow at once (a Postgres login's
        exchange): when it answers 0 the attempt is admitted and counts as a failure until
        :meth:`failed`, :meth:`succeeded` or :meth:`abandoned` reports its verdict, one of
        which must follow."""
        now = self._clock()
        with self._lock:
            state = self._state(peer, now)
            if state.barred_until > now:
                self._throttled[listener] += 1
                return state.barred_until - now
            state.pending += 1
            beyond = state.failures + state.pending - self.free_failures
            if beyond > 0:  # others from this peer wait for this one's verdict, at least
                state.barred_until = now + self._delay(beyond)
            return 0.0

    def failed(self, peer: str, listener: str, *, admitted: bool = False) -> None:
        """``peer``'s credential was checked and is wrong (``admitted``: by :meth:`admit`)."""
        now = self._clock()
        with self._lock:
            self._failures[listener] += 1
            state = self._state(peer, now)
            if admitted:
                state.pending = max(0, state.pending - 1)
            state.failures += 1
            state.last_failure = now
            beyond = state.failures + state.pending - self.free_failures
            if beyond > 0:
                state.barred_until = max(state.barred_until, now + self._delay(beyond))

    def succeeded(self, peer: str) -> None:
        """``peer`` authenticated: its failures are forgotten."""
        if peer in self._peers:
            with self._lock:
                self._peers.pop(peer, None)

    def abandoned(self, peer: str) -> None:
        """An attempt admitted by :meth:`admit` ended without a verdict (the client left):
        no failure, and no longer in flight."""
        with self._lock:
            state = self._peers.get(peer)
            if state is not None:
                state.pending = max(0, state.pending - 1)
                if state.pending == 0 and state.failures == 0:
                    del self._peers[peer]

    def _delay(self, beyond: int) -> float:
        return min(self.max_delay, self.base_delay * 2.0 ** min(beyond - 1, 62))

    def _state(self, peer: str, now: float) -> _Peer:
        """Under ``_lock``: ``peer``'s entry, made (or started again, when it was quiet for
        ``forget_seconds``) if need be."""
        state = self._peers.get(peer)
        if state is not None and (state.pending or now - state.last_failure <= self.forget_seconds):
            return state
        if state is None and len(self._peers) >= self.max_peers:
            self._make_room(now)
        state = self._peers[peer] = _Peer(0, now, now)
        return state

    def _make_room(self, now: float) -> None:
        """Under ``_lock``: drop the forgotten peers, or else the one whose bar ended first."""
        stale = [
            p
            for p, s in self._peers.items()
            if not s.pending and now - s.last_failure > self.forget_seconds
        ]
        for peer in stale:
            del self._peers[peer]
        if len(self._peers) >= self.max_peers:
            del self._peers[min(self._peers, key=lambda p: self._peers[p].barred_until)]

    # -- the REST API --------------------------------------------------------------------------

    def check_http(
        self, client: tuple[str, int] | None, token: str | None, check: Callable[[str | None], T]
    ) -> T:
        """Run ``check(token)`` (the node's token check) for an HTTP caller at ``client``
        (the ASGI scope's ``client``) and return what it returns (the caller's principal):
        a barred caller gets a 401 without its token being looked at, a wrong token counts
        as a failure (a missing one does not)."""
        host = client[0] if client else None
        # Only a caller that failed lately can be barred: with none (always, on a node that
        # asks for no token), the caller's address is not even looked at.
        peer = peer_of(host) if self._peers else None
        wait = 0.0 if peer is None else self.wait(peer, "http")
        if wait > 0:
            # A 401 like any refused token (clients raise their authentication error), its
            # message saying why; retry_after_seconds in the body says when to try again.
            error = HttpError(
                ErrorCode.UNAUTHORIZED,
                f"too many failed authentications from {peer}: the token was not checked; "
                f"retry in {wait:.1f} s",
            )
            error.extra = {"retry_after_seconds": round(wait, 3)}
            raise error
        try:
            found = check(token)
        except AuthenticationError:
            if token is not None:
                self.failed(peer_of(host), "http")
            raise
        if token is not None and self._peers:
            self.succeeded(peer_of(host))
        return found

    # -- metrics -------------------------------------------------------------------------------

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """``(failures, throttled)`` by listener since the node started."""
        with self._lock:
            return dict(self._failures), dict(self._throttled)

    def collect(self) -> Iterator[Metric]:
        """Prometheus counters (register the object with a registry)."""
        failures, throttled = self.counts()
        checked = CounterMetricFamily(
            "sparkiq_auth_failures",
            "Credentials presented and wrong, by listener (http: a bearer token, pg: a password, "
            "flight: a bearer token or basic auth)",
            labels=["listener"],
        )
        refused = CounterMetricFamily(
            "sparkiq_auth_throttled",
            "Authentication attempts refused unchecked: their address failed too often lately",
            labels=["listener"],
        )
        for listener in LISTENERS:
            checked.add_metric([listener], failures[listener])
            refused.add_metric([listener], throttled[listener])
        yield from (checked, refused)


def auth_failures_of(node: object) -> AuthFailures:
    """The node's :class:`AuthFailures` (its ``auth_failures`` attribute), or a new one with
    the default policy for a node without (a test double)."""
    found = getattr(node, "auth_failures", None)
    return found if isinstance(found, AuthFailures) else AuthFailures()
