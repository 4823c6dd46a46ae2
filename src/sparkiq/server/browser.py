"""What a web page may make a node do: the Host, Origin and content-type checks, and the
console's Content-Security-Policy.

A browser visiting any site can send requests to a node it can reach (one on the visitor's
own machine, one on the visitor's network). Two doors are closed here, before routing and
before the token check (a forged request costs no more than a lookup in a set):

- **DNS rebinding.** A page at ``http://evil.example:8081`` whose name is re-pointed at
  ``127.0.0.1`` reads the node *same-origin*: no CORS check applies, but every request
  still says ``Host: evil.example:8081``. A node answers only the Host names it is
  configured for (:class:`BrowserGuard`): ``localhost``, any IP address literal (an
  address is not a DNS name, so no rebinding can produce it: this is also what
  Kubernetes probes send, the pod's IP), the host of the node's own URL (``advertise`` or
  ``listen``), and the ``allowed_hosts`` setting (``*`` allows every name). Others get
  ``421`` naming that setting. Probes (``/healthz``, ``/readyz``) are checked like every
  path (``/readyz`` names tables): Kubernetes' probes send the pod's IP, an address. A
  request without a Host header (HTTP/1.0) is answered: every browser sends one.
- **Cross-origin writes.** A page may POST to any address without asking ("no-cors"),
  but only with a body typed ``text/plain``, ``application/x-www-form-urlencoded`` or
  ``multipart/form-data`` (the CORS-safelisted types); any other type makes the browser
  ask first (a preflight ``OPTIONS``, which no node answers with a grant). So every POST
  must name another type (sparkiq's callers send ``application/json`` or the node
  protocol's type): ``415`` otherwise. A POST whose ``Origin`` header names another origin
  than the one it was sent to is refused too (``403``): a same-origin page (the console)
  is the only one that may post with a browser.

GETs carry no ``Origin`` check: they change nothing, and a cross-origin page cannot read
their answers (no node sends ``Access-Control-Allow-Origin``).

The console page is sent with a Content-Security-Policy (:func:`console_policy`) that lets
only its own inline script and style run, by hash, and its requests go only to the node.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sparkiq.error_codes import ErrorCode
from sparkiq.server.http_errors import HttpError

__all__ = ["SIMPLE_CONTENT_TYPES", "BrowserGuard", "console_policy"]

#: Content types a browser sends cross-origin without a preflight (the Fetch standard's
#: CORS-safelisted ones), and "" for a POST that names none.
SIMPLE_CONTENT_TYPES = frozenset(
    {"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"}
)

_SETTING = "allowed_hosts (sparkiq serve --allowed-host, SPARKIQ_ALLOWED_HOSTS)"


#: How many answered Host values a guard remembers (a node is reached by a few names).
_REMEMBERED = 64


@dataclass(frozen=True, slots=True)
class BrowserGuard:
    """The Host names one node answers and the origins it takes POSTs from (see the module
    docstring). Immutable: built once per server by :meth:`for_node`."""

    #: exact host names, lowercase, without a port or trailing dot
    hosts: frozenset[str]
    #: ``*.example.com`` entries as ``.example.com``: any name ending so
    suffixes: tuple[str, ...]
    #: ``*`` was configured: every Host is answered
    any_host: bool
    #: ``host[:port]`` of the node's own URLs, as an ``Origin`` names them (a proxy in front
    #: may rewrite Host; a page from the node's advertised URL is still its own)
    own_origins: frozenset[str]
    #: Host header values (as sent: bytes) already found answered (at most _REMEMBERED): a
    #: request from the same client skips parsing an address again (some 10 us a request).
    #: Only the event loop's thread checks hosts; a set add is atomic besides.
    _answered: set[bytes] = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def for_node(cls, allowed_hosts: Iterable[str], urls: Iterable[str | None]) -> BrowserGuard:
        """``allowed_hosts`` as :class:`~sparkiq.NodeConfig` holds them (validated there),
        plus the hosts of ``urls`` (the node's own URL and its ``listen`` address)."""
        hosts = {"localhost"}
        suffixes = []
        any_host = False
        for entry in allowed_hosts:
            name = _normal(entry)
            if name == "*":
                any_host = True
            elif name.startswith("*."):
                suffixes.append(name[1:])
            elif name:
                hosts.add(name.strip("[]"))
        own = set()
        for url in urls:
            if not url:
                continue
            try:
                parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
            except ValueError:  # not a URL: names no host to answer
                continue
            if parts.hostname:
                hosts.add(_normal(parts.hostname))
                own.add(parts.netloc.lower())
        return cls(frozenset(hosts), tuple(suffixes), any_host, frozenset(own))

    def check(self, scope: dict[str, Any]) -> None:
        """Raise :class:`HttpError` if a browser could have sent this request from a page
        the node does not trust; return otherwise (see the module docstring)."""
        post = scope["method"] == "POST"
        types: list[bytes] = []
        origins: list[bytes] = []
        for name, raw in scope["headers"]:  # one pass over the raw headers, no decoding
            if name == b"host":
                if raw not in self._answered:
                    self._check_host(raw.decode("latin-1"))
                    if len(self._answered) < _REMEMBERED:
                        self._answered.add(raw)
            elif not post:
                continue
            elif name == b"content-type":
                types.append(raw)
            elif name == b"origin":
                origins.append(raw)
        if not post:
            return
        for value in types or [b""]:
            essence = value.decode("latin-1").split(";", 1)[0].strip().lower()
            if essence in SIMPLE_CONTENT_TYPES:
                named = f"'content-type: {essence}'" if essence else "no content-type"
                raise HttpError(
                    ErrorCode.UNSUPPORTED_CONTENT_TYPE,
                    f"a POST with {named} is refused, because any web page can send one: "
                    "send 'content-type: application/json' (curl: -H 'content-type: "
                    "application/json')",
                    "content-type",
                )
        if origins:  # a browser's; programs send none
            host_values = _header_values(scope, b"host")
            for origin in origins:
                self._check_origin(origin.decode("latin-1"), host_values)

    def allows_host(self, host: str) -> bool:
        """Whether ``host`` (a name or address, without a port) is answered."""
        name = _normal(host).strip("[]")
        if self.any_host or name in self.hosts:
            return True
        if any(name.endswith(suffix) for suffix in self.suffixes):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def _check_host(self, value: str) -> None:
        host = _host_of(value)
        if host is not None and self.allows_host(host):
            return
        raise HttpError(
            ErrorCode.HOST_NOT_ALLOWED,
            f"this node does not answer requests for host {value[:200]!r} (a guard against "
            f"DNS rebinding); if clients reach it by that name, add the name to {_SETTING}",
            "host",
        )

    def _check_origin(self, origin: str, host_values: list[str]) -> None:
        try:
            parts = urllib.parse.urlsplit(origin.strip())
        except ValueError:  # "http://[x": no origin a browser sends; refused below
            parts = urllib.parse.urlsplit("")
        netloc = parts.netloc.lower() if parts.scheme in ("http", "https") else ""
        if netloc and (
            netloc in self.own_origins or netloc in (h.strip().lower() for h in host_values)
        ):
            return
        raise HttpError(
            ErrorCode.CROSS_ORIGIN,
            f"a POST from a page at {origin[:200]!r} is refused: only this node's own pages "
            "(the console) may post from a browser; programs send no Origin header",
            "origin",
        )


def _header_values(scope: dict[str, Any], name: bytes) -> list[str]:
    return [v.decode("latin-1") for n, v in scope["headers"] if n == name]


def _normal(name: str) -> str:
    return name.strip().lower().rstrip(".")


def _host_of(value: str) -> str | None:
    """The host of a Host header (``name``, ``name:port``, ``[v6]:port``), or ``None``
    when it is not one."""
    value = value.strip()
    if value.startswith("["):
        inside, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest[:1] == ":" and rest[1:].isdigit())):
            return None
        return inside
    name, colon, port = value.partition(":")
    if not name or (colon and not port.isdigit()):
        return None
    return name


#: The page's inline ``<script>`` and ``<style>`` elements (it has no attributes on them and
#: loads nothing else); a hash covers the exact text between the tags.
_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.DOTALL)


def console_policy(html: bytes) -> bytes:
    """The ``Content-Security-Policy`` for the console page ``html``: scripts and styles
    only those written inline in it, allowed by their SHA-256 (no other script runs, even
    if a value shown on the page ever escaped its text node; no ``style`` attributes),
    requests only to the node itself, no plugins, frames, form posts or ``<base>``."""
    sources: dict[bytes, list[str]] = {b"script": [], b"style": []}
    for match in _INLINE.finditer(html):
        digest = base64.b64encode(hashlib.sha256(match.group(2)).digest()).decode()
        sources[match.group(1)].append(f"'sha256-{digest}'")
    scripts = " ".join(sources[b"script"]) or "'none'"
    styles = " ".join(sources[b"style"]) or "'none'"
    policy = [
        "default-src 'none'",
        f"script-src {scripts}",
        f"style-src {styles}",
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
    return "; ".join(policy).encode()
