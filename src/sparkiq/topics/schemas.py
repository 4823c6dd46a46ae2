"""A published topic's schema, watched while it is followed: :class:`SchemaWatch`.

A sparkiq publisher writes a topic's schema to ``sparkiq-schemas`` before the first batch,
and again, *before* the batch that needs it, whenever the table's columns change (a column
added, removed, or of another type). A follower opened before the change would read the new
records by the old columns: a new member ignored, a removed one read as null. To never serve
such a row, the follower of a published topic reads values strictly
(:class:`~sparkiq.topics.records.SchemaMismatch` when the members are not the columns), and
on a record that does not fit, or every ``interval`` seconds, asks :meth:`SchemaWatch.check`
whether ``sparkiq-schemas`` moved since it last read it. Since the schema was written before
the record, a check made after the record was fetched sees it. When the schema differs, the
follower stops where it is (its table keeps serving the rows of the old schema, at their
position) and the node follows the topic again with the new one
(:mod:`sparkiq.topics.catalog`).

The check is one metadata and one offsets request to the broker (no read) when nothing was
written to ``sparkiq-schemas``; its own consumer, made at the first check, reads the topic
again when something was.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sparkiq.errors import ConfigError
from sparkiq.topics.consumer import new_consumer, read_published, redact, schemas_end
from sparkiq.topics.records import TopicFormat, published_schema
from sparkiq.topics.spec import TopicSpec

__all__ = ["SchemaWatch", "published_format"]

log = logging.getLogger("sparkiq.topic")

#: How long a check waits for the broker (the follower's reads wait behind it).
CHECK_TIMEOUT = 10.0
#: How long after a check the broker did not answer the next one may ask it again.
RETRY_SECONDS = 5.0


def published_format(doc: Any, spec: TopicSpec) -> TopicFormat:
    """The strict format of a ``sparkiq-schemas`` value, with ``spec``'s key and value
    formats, if given, over the published ones."""
    schema, key_format, value_format, _ = published_schema(doc, spec.topic)
    return TopicFormat(
        schema, spec.key_format or key_format, spec.value_format or value_format, strict=True
    )


def _same(a: TopicFormat, b: TopicFormat) -> bool:
    return (a.schema, a.key_format, a.value_format) == (b.schema, b.key_format, b.value_format)


class SchemaWatch:
    """Whether the schema of ``spec``'s topic in ``sparkiq-schemas`` still is ``current``,
    which was read when the topic's end offsets there were ``ends``. Not thread-safe: the
    follower calls it under its lock. :meth:`close` closes its consumer."""

    def __init__(
        self,
        spec: TopicSpec,
        bootstrap_servers: str,
        current: TopicFormat,
        ends: dict[int, int],
        interval: float,
    ) -> None:
        self.spec = spec
        self.bootstrap_servers = bootstrap_servers
        self.current = current
        self.interval = interval
        self._ends = ends
        self._checked_at = time.monotonic()
        self._consumer: Any = None
        #: whether the last check could not tell (the broker did not answer...)
        self.failed = False
        #: why the schema the last check found cannot be followed (None: it can)
        self.unreadable: str | None = None

    def due(self) -> bool:
        """Whether ``interval`` seconds passed since the last check."""
        return time.monotonic() - self._checked_at >= self.interval

    def check(self) -> TopicFormat | None:
        """The topic's new format when its published schema is no longer ``current``, else
        None: unchanged, changed into one this sparkiq cannot read (:attr:`unreadable` says
        why), or the broker cannot tell now (:attr:`failed`; logged; asked again
        :data:`RETRY_SECONDS` later at the soonest: the follower reads what did not fit
        again meanwhile, never by the old columns)."""
        now = time.monotonic()
        if self.failed and now - self._checked_at < RETRY_SECONDS:
            return None
        self._checked_at, self.failed, self.unreadable = now, False, None
        try:
            if self._consumer is None:
                self._consumer = new_consumer(
                    self.bootstrap_servers, self.spec.kafka_config, self.spec.topic
                )
            ends = schemas_end(self._consumer, CHECK_TIMEOUT)
            if ends is None or ends == self._ends:
                return None
            doc, ends = read_published(self._consumer, self.spec.topic, self.bootstrap_servers)
            found = published_format(doc, self.spec)
        except ConfigError as exc:  # no schema any more, one this sparkiq cannot read
            self.unreadable = redact(exc.message, self.spec.kafka_config)
            return None
        except Exception as exc:  # the client's KafkaException
            self.failed = True
            log.warning(
                "topic %r: cannot check its schema in sparkiq-schemas (%s); its records "
                "that do not fit wait for a check that can",
                self.spec.topic,
                redact(str(exc), self.spec.kafka_config),
            )
            return None
        self._ends = ends
        return None if _same(found, self.current) else found

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
