"""Serving: what one node does with the tables it holds, alone or in a cluster.

Its configuration (:mod:`~sparkiq.serving.config`), the replicas it hosts and the tailer
that keeps them current (:mod:`~sparkiq.serving.hosting`), key lookups and typed requests
answered from them (:mod:`~sparkiq.serving.lookup`), followers and attached checkpoints,
and what a node reports of its tables (Kafka lag, the writers' status). Clustering --
membership, assignment, routing, transports -- is :mod:`sparkiq.cluster`, one layer up: a
node that has peers hands :class:`~sparkiq.serving.lookup.Lookup` a view of it. Nothing is
re-exported here, so a module that needs one room (the CLI reads
:mod:`sparkiq.serving.config`) does not load the others."""
