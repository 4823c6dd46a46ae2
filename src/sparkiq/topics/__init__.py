"""Kafka topics as tables: a compacted topic followed as a read-only sparkiq table.

- :mod:`sparkiq.topics.jsonvalues`: column values in the record format's JSON;
- :mod:`sparkiq.topics.keys`: key formats and Kafka's murmur2 partitioner;
- :mod:`sparkiq.topics.columns`: columns given as a Spark DDL string;
- :mod:`sparkiq.topics.records`: a record's key and value as a row;
- :mod:`sparkiq.topics.spec`: what to follow;
- :mod:`sparkiq.topics.schemas`: a published topic's schema, watched;
- :mod:`sparkiq.topics.consumer`: the Kafka client, the published schema, secrets;
- :mod:`sparkiq.topics.source`: the topic as a changelog source;
- :mod:`sparkiq.topics.catalog`: the followed topics of a node;
- :mod:`sparkiq.topics.lag`: how far a followed topic is behind.

The handle is :func:`sparkiq.follow_topic` (:mod:`sparkiq.serving.topic`).
"""
