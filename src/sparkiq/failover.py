"""Which failures of a node send a :class:`~sparkiq.Client` to its next node, and what
every node failing amounts to.

A node that cannot be reached says nothing about the request; neither does a node that
answers it cannot answer *now* -- ``unavailable`` (a fault of its own),
``upstream_unavailable`` or ``partition_failed`` (it could not reach the nodes it needed:
partitioned away, or refused by its peers for a clock or a secret that disagrees). Another
node may answer both. Any other error answer is the node's verdict on the request itself
(a bad token, an unknown table, an invalid query) and is raised at once.
"""

from __future__ import annotations

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import NodeUnreachableError, SparkiqError
from sparkiq.wire.protocol import RemoteError

__all__ = ["CANNOT_ANSWER", "Failures"]

#: Answers in which a node says it cannot answer now (its own verdict, retryable).
CANNOT_ANSWER = frozenset(
    {ErrorCode.UNAVAILABLE, ErrorCode.UPSTREAM_UNAVAILABLE, ErrorCode.PARTITION_FAILED}
)


class Failures:
    """The nodes that failed one call, and the error to raise if none answers."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.answered: RemoteError | None = None  # the first "cannot answer now" answer

    def add(self, url: str, exc: SparkiqError) -> None:
        """Record ``url``'s failure; re-raise ``exc`` unless another node may answer."""
        if isinstance(exc, RemoteError) and exc.code in CANNOT_ANSWER:
            self.answered = self.answered or exc
        elif not isinstance(exc, NodeUnreachableError):
            raise exc
        self.errors.append(f"{url}: {exc!r}")

    def error(self) -> SparkiqError:
        """What every node failing amounts to: the first node's answer that it could not
        answer now (an answer says more than a node that never answered), with a note
        listing every node's failure when there were several; else
        :class:`NodeUnreachableError`."""
        summary = "; ".join(self.errors)
        if self.answered is None:
            return NodeUnreachableError(f"no node answered: {summary}")
        if len(self.errors) > 1:
            self.answered.add_note(f"no node answered: {summary}")
        return self.answered
