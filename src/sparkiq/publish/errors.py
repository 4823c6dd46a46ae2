"""The errors of publishing a table to Kafka.

::

    SparkiqError
    └── PublishError              the publisher cannot go on (it stops; its status says why)
        ├── PublishGapError       the table's changelog no longer has batches the topic lacks
        └── PublisherFencedError  another publisher of the same table and topic took over
"""

from __future__ import annotations

from sparkiq.errors import SparkiqError

__all__ = ["PublishError", "PublishGapError", "PublisherFencedError"]


class PublishError(SparkiqError):
    """Publishing a table to its topic failed in a way retrying will not fix."""


class PublishGapError(PublishError):
    """Batches the topic has not got are gone from the changelog (retention deleted them)."""


class PublisherFencedError(PublishError):
    """A newer publisher with the same transactional id started: this one must stop."""
