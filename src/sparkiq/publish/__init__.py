"""Publishing a table to a compacted Kafka topic, exactly once (docs/kafka.md).

:class:`~sparkiq.publish.publisher.TablePublisher` follows a table's changelog and produces
every committed batch in one Kafka transaction; :mod:`sparkiq.publish.records` is the
record format; :mod:`sparkiq.publish.topic` creates and checks the topics and finds where a
topic stopped. Needs the Kafka client confluent-kafka (``pip install 'sparkiq[kafka]'``),
imported when a publisher is made.
"""
