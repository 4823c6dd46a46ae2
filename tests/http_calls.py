"""The tests' HTTP calls to the nodes they start, without loading a CA bundle per call.

``httpx.get`` and its siblings build a client per call, and a client that verifies
certificates parses certifi's CA bundle (about 150 certificates, tens of milliseconds of CPU)
even for an ``http://`` URL. In the loops that poll a node coming up or a cluster forming
again, that was about 60 CPU-seconds of the suite (sampled with py-spy). These functions keep
one client per ``verify`` setting. The client keeps no connection alive: each call opens its
own, as ``httpx.get`` does, so a call to a killed or paused node fails the way it did.

A test that needs a client of its own (headers, a timeout, a connection kept alive) takes
:func:`new_client`: ``httpx.Client`` verifying with the process's one default context, as
httpx would build it, instead of a new one each.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import Iterator
from typing import Any

import httpx


@functools.cache
def _client(verify: ssl.SSLContext | bool) -> httpx.Client:
    return httpx.Client(verify=verify, limits=httpx.Limits(max_keepalive_connections=0))


@functools.cache
def _default_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()  # what httpx builds for verify=True: certifi's CAs


def new_client(**options: Any) -> httpx.Client:
    """``httpx.Client(**options)``; without ``verify``, verifying as httpx does by default
    with a context built once per process (a new one parses the CA bundle: ~35 ms of CPU)."""
    options.setdefault("verify", _default_context())
    return httpx.Client(**options)


@contextlib.contextmanager
def stream(
    method: str, url: str, *, verify: ssl.SSLContext | bool = True, **options: Any
) -> Iterator[httpx.Response]:
    """``httpx.stream``: the same arguments, the same errors."""
    with _client(verify).stream(method, url, **options) as response:
        yield response


def request(
    method: str, url: str, *, verify: ssl.SSLContext | bool = True, **options: Any
) -> httpx.Response:
    """``httpx.request``: the same arguments, the same errors."""
    return _client(verify).request(method, url, **options)


def get(url: str, **options: Any) -> httpx.Response:
    return request("GET", url, **options)


def post(url: str, **options: Any) -> httpx.Response:
    return request("POST", url, **options)


def put(url: str, **options: Any) -> httpx.Response:
    return request("PUT", url, **options)


def delete(url: str, **options: Any) -> httpx.Response:
    return request("DELETE", url, **options)
