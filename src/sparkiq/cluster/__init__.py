"""Serving nodes: hosting replicas and answering queries."""

from sparkiq.cluster.follower import Follower, follow
from sparkiq.cluster.node import Node, TableView

__all__ = ["Follower", "Node", "TableView", "follow"]
