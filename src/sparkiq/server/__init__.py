"""The HTTP side of a node: the REST API, the node protocol and the metrics endpoint.

This is the only package that imports the web server. It serves any object offering a
node's methods (:class:`~sparkiq.server.served.ServedNode`); the :class:`~sparkiq.Node` facade,
one layer up, starts it.
"""

from __future__ import annotations

from sparkiq.limits import HttpLimits  # the settings live below cluster (sparkiq.limits)
from sparkiq.server.runner import RunningServer, bind_advertised, bind_socket, start_server
from sparkiq.server.served import ServedNode

__all__ = [
    "HttpLimits",
    "RunningServer",
    "ServedNode",
    "bind_advertised",
    "bind_socket",
    "start_server",
]
