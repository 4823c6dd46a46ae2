"""Serving nodes: hosting replicas and answering queries."""

from sparkiq.cluster.node import Node

__all__ = ["Node"]
