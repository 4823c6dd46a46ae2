"""The HTTP side of a node: the REST API, the node protocol and the metrics endpoint.

This is the only package that imports the web server. It serves any object offering a
node's methods (see :class:`sparkiq.server.app.RestApp`), so the cluster layer can embed it.
"""

from __future__ import annotations

from sparkiq.server.runner import RunningServer, start_server

__all__ = ["RunningServer", "start_server"]
