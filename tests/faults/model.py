"""The writer's input, a pure function of the batch id, and the table it must produce.

Table ``t`` (``k string, n long``, :data:`PARTITIONS` partitions) over :data:`KEYS`. Batch
``b`` writes key ``i`` with ``n = b * 1000 + i`` unless ``(b + i) % 3 == 0`` (the key is left
alone), and deletes it when ``(7 * b + i) % 11 == 0``; batch 0 writes every key. So a row's
``n`` names the batch that last wrote it, a batch lost or applied out of order leaves a row
that disagrees with the position it is served at, and :meth:`Model.state` is the ground
truth a history is checked against, computed in plain Python.
"""

from __future__ import annotations

from sparkiq import partition_for

KEYS = [f"k{i:03d}" for i in range(48)]
PARTITIONS = 6
TABLE = "t"


def changes(batch_id: int) -> dict[str, int | None]:
    """What batch ``batch_id`` writes: key -> n, or None for a deletion."""
    out: dict[str, int | None] = {}
    for i, key in enumerate(KEYS):
        if batch_id > 0 and (7 * batch_id + i) % 11 == 0:
            out[key] = None
        elif batch_id == 0 or (batch_id + i) % 3 != 0:
            out[key] = batch_id * 1000 + i
    return out


def partition_of(key: str) -> int:
    return partition_for([key], ["string"], PARTITIONS)


class Model:
    """The table after each batch, computed once per batch and kept (a few KB per batch)."""

    def __init__(self) -> None:
        self._states: list[dict[str, int]] = []

    def state(self, batch_id: int) -> dict[str, int]:
        """key -> n after batches ``0..batch_id`` (``batch_id`` < 0: the empty table)."""
        if batch_id < 0:
            return {}
        while len(self._states) <= batch_id:
            state = dict(self._states[-1]) if self._states else {}
            for key, n in changes(len(self._states)).items():
                if n is None:
                    state.pop(key, None)
                else:
                    state[key] = n
            self._states.append(state)
        return self._states[batch_id]

    def partition_state(self, batch_id: int, partition: int) -> dict[str, int]:
        return {k: n for k, n in self.state(batch_id).items() if partition_of(k) == partition}
