"""Which nodes host which partitions: rendezvous (highest-random-weight) hashing.

For every ``(table, partition)`` each live member gets a score from a hash of
``(member, table, partition)``; members ordered by descending score are the partition's
replicas: the first is *active*, the next ``standbys`` are *standbys*. Every node computes
the same order from the same membership, with no coordination. When a member joins or
leaves, only the partitions whose top ``1 + standbys`` change move -- on average
``1/n`` of them -- and a leaving member's partitions are spread over the others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Assignment", "rendezvous_order"]


def _score(member: str, table: str, partition: int) -> bytes:
    data = f"{table}\x00{partition}\x00{member}".encode()
    return hashlib.blake2b(data, digest_size=8).digest()


def rendezvous_order(members: Iterable[str], table: str, partition: int) -> list[str]:
    """``members`` from most to least preferred for ``partition`` of ``table``.

    Deterministic across processes and platforms (BLAKE2b, ties broken by member id).
    """
    return sorted(members, key=lambda m: (_score(m, table, partition), m), reverse=True)


@dataclass(frozen=True)
class Assignment:
    """The replicas of every partition for one membership view."""

    members: tuple[str, ...]
    standbys: int = 1
    _memo: dict[tuple[str, int], tuple[str, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def replicas(self, table: str, partition: int) -> tuple[str, ...]:
        """Active first, then the standbys (fewer when there are not enough members)."""
        key = (table, partition)
        found = self._memo.get(key)
        if found is None:
            ordered = rendezvous_order(self.members, table, partition)
            found = self._memo[key] = tuple(ordered[: 1 + self.standbys])
        return found

    def active(self, table: str, partition: int) -> str | None:
        replicas = self.replicas(table, partition)
        return replicas[0] if replicas else None

    def hosted_by(self, member: str, table: str, partitions: int) -> frozenset[int]:
        """The partitions of ``table`` (of ``partitions``) that ``member`` should host."""
        return frozenset(p for p in range(partitions) if member in self.replicas(table, p))
