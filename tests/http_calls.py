"""The tests' HTTP calls to the nodes they start, without loading a CA bundle per call.

``httpx.get`` and its siblings build a client per call, and a client that verifies
certificates parses certifi's CA bundle (about 150 certificates, tens of milliseconds of CPU)
even for an ``http://`` URL. In the loops that poll a node coming up or a cluster forming
again, that was about 60 CPU-seconds of the suite (sampled with py-spy). These functions keep
one client per ``verify`` setting. The client keeps no connection alive: each call opens its
own, as ``httpx.get`` does, so a call to a killed or paused node fails the way it did.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def _client(verify: ssl.SSLContext | bool) -> httpx.Client:
    return httpx.Client(verify=verify, limits=httpx.Limits(max_keepalive_connections=0))


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
