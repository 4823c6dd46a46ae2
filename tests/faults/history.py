"""Client load that records every operation: what was asked, what came back, where, when.

Each :class:`Loader` is one client session (one :class:`~sparkiq.Client`, preferring its own
entry node, failing over to the others). Every read carries as its bound the merge of every
position the session has seen, so the session asks for monotonic reads and the checker can
verify it got them. Operations: ``get`` (a key), ``range`` (every partition, one pinned
batch), ``sql`` (an aggregate over every partition). A failure is recorded as an operation
too; the checker counts it as unavailability, never as an anomaly.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sparkiq import Client, KeyQuery, Position, PositionBound, RangeQuery, StateQueryRequest
from sparkiq.errors import SparkiqError
from tests.faults.model import KEYS, TABLE

SQL = f"SELECT count(*) AS c, sum(n) AS s FROM {TABLE}"


@dataclass
class Op:
    """One client operation; ``position`` and ``bound`` map partition -> batch id."""

    client: str
    kind: str  # get | range | sql
    arg: str | None
    start: float
    end: float = 0.0
    ok: bool = False
    error: str = ""
    node: str = ""
    bound: dict[int, int] = field(default_factory=dict)
    position: dict[int, int] = field(default_factory=dict)
    value: Any = None  # get: n or None; range: {key: n}; sql: [count, sum]


def _batches(position: Position) -> dict[int, int]:
    return {int(p): int(b) for p, b in position.to_map().get(TABLE, {}).items()}


class Loader(threading.Thread):
    """Runs operations back to back until stopped; ``ops`` holds them in order."""

    def __init__(
        self,
        name: str,
        urls: list[str],
        seed: int,
        *,
        timeout: float = 5.0,
        pause: float = 0.0,
        token: str | None = None,
        ca: str | None = None,
    ) -> None:
        super().__init__(daemon=True, name=f"loader-{name}")
        self.client_name, self.urls, self.rng = name, urls, random.Random(seed)
        self.timeout, self.pause = timeout, pause
        self.token, self.ca = token, ca  # for nodes that ask for a token, or serve https
        self.ops: list[Op] = []
        self.seen = Position.empty()
        self.stop_event = threading.Event()

    def run(self) -> None:
        with Client(
            self.urls, self.token, timeout=self.timeout, monotonic=False, ca=self.ca
        ) as client:
            while not self.stop_event.is_set():
                roll = self.rng.random()
                kind = "get" if roll < 0.7 else "range" if roll < 0.85 else "sql"
                self.ops.append(self.one(client, kind))
                if self.pause:
                    self.stop_event.wait(self.pause)

    def one(self, client: Client, kind: str) -> Op:
        key = self.rng.choice(KEYS) if kind == "get" else None
        op = Op(
            self.client_name,
            kind,
            key if kind == "get" else SQL if kind == "sql" else None,
            time.monotonic(),
            bound=_batches(self.seen),
        )
        try:
            if kind == "sql":
                result = client.sql(SQL, bound=self.seen if op.bound else None)
                position = result.position
                op.value = [result.rows[0]["c"], result.rows[0]["s"]]
            else:
                query = KeyQuery.with_key(key) if kind == "get" else RangeQuery.with_no_bounds()
                request = StateQueryRequest.in_store(TABLE).with_query(query)
                if op.bound:
                    request = request.with_position_bound(PositionBound.at(self.seen))
                answer = client.query(request)
                failed = {p: r for p, r in answer.partition_results.items() if r.is_failure}
                if failed:
                    p, r = next(iter(failed.items()))
                    raise SparkiqError(f"partition {p}: {r.failure_reason}: {r.failure_message}")
                position = answer.position
                if kind == "get":
                    row = answer.only_partition_result().result
                    op.value = None if row is None else row["n"]
                else:
                    value: dict[str, int] = {}
                    for result in answer.partition_results.values():
                        with result.result as rows:
                            value.update((k, row["n"]) for k, row in rows)
                    op.value = value
            op.position = _batches(position)
            op.ok = True
            self.seen = self.seen.merge(position)
        except SparkiqError as exc:
            op.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        except Exception as exc:  # anything else is recorded, and judged
            op.error = f"UNEXPECTED {type(exc).__name__}: {str(exc)[:300]}"
        op.end = time.monotonic()
        op.node = self.urls[0]
        return op

    def stop(self) -> list[Op]:
        self.stop_event.set()
        self.join(timeout=60)
        return self.ops
