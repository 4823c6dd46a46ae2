"""Kafka topics as tables: a compacted topic followed as a read-only sparkiq table.

- :mod:`sparkiq.topics.jsonvalues`: column values in the record format's JSON;
- :mod:`sparkiq.topics.keys`: key formats and Kafka's murmur2 partitioner;
- :mod:`sparkiq.topics.columns`: columns given as a Spark DDL string;
- :mod:`sparkiq.topics.records`: a record's key and value as a row;
- :mod:`sparkiq.topics.source`: the topic as a changelog source.

The handle is :func:`sparkiq.follow_topic` (:mod:`sparkiq.serving.topic`).
"""
