"""Serving nodes' rooms: configuration, hosting, lookups and routing, membership and
assignment, rebalancing, transports, followers. :class:`sparkiq.Node` (one layer up, in
:mod:`sparkiq.node`) assembles them."""

from sparkiq.cluster.config import NodeConfig
from sparkiq.cluster.follower import Follower, follow
from sparkiq.cluster.hosting import TableView

__all__ = ["Follower", "NodeConfig", "TableView", "follow"]
