"""Serving nodes' rooms: configuration, hosting, lookups and routing, membership and
assignment, rebalancing, transports, followers. :class:`sparkiq.Node` (one layer up, in
:mod:`sparkiq.node`) assembles them. Nothing is re-exported here, so a module that needs one
room (the CLI reads :mod:`sparkiq.cluster.config`) does not load the others."""
