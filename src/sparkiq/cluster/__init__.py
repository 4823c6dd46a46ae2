"""Clustering: membership and failure detection, assignment and rebalancing, routing and
the transports between nodes, node credentials. It builds on :mod:`sparkiq.serving` (what
one node hosts and answers); :class:`sparkiq.Node` (one layer up, in :mod:`sparkiq.node`)
assembles both. Nothing is re-exported here."""
