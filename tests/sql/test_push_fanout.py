"""Push queries fanned out to many subscribers: each gets exactly its own changes, however
it reads them (change by change, in chunks from a thread, or awaited on an event loop),
compared with a ground truth computed here from the rows committed."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from sparkiq.query.position import Position
from sparkiq.server.streams import ENCODE_ON_LOOP_MAX, change_lines, push_stream
from sparkiq.sql.push import (
    Change,
    SlowConsumerError,
    Subscription,
    SubscriptionError,
    SubscriptionHub,
)
from tests.changelog.helpers import make_table, write_batch

Batch = dict[str, int | None]
Truth = dict[int, dict[str, Any]]
HANG_S = 60.0  # a bound on a hang, never a timing expectation

# statement -> (WHERE as Python, projection as Python), the ground truth's own reading
STATEMENTS: dict[str, tuple[Callable[[str, int], bool] | None, Callable[[str, int], Any]]] = {
    "SELECT * FROM t EMIT CHANGES": (None, lambda k, n: {"k": k, "n": n}),
    "SELECT k FROM t WHERE n < 30 EMIT CHANGES": (lambda k, n: n < 30, lambda k, n: {"k": k}),
    "SELECT n * 2 AS twice FROM t WHERE n >= 50 EMIT CHANGES": (
        lambda k, n: n >= 50,
        lambda k, n: {"twice": n * 2},
    ),
    "SELECT * FROM t WHERE k IN ('k001', 'k007', 'k013', 'k020') EMIT CHANGES": (
        lambda k, n: k in ("k001", "k007", "k013", "k020"),
        lambda k, n: {"k": k, "n": n},
    ),
    "SELECT k, n FROM t WHERE n BETWEEN 20 AND 70 OR k = 'k003' EMIT CHANGES": (
        lambda k, n: 20 <= n <= 70 or k == "k003",
        lambda k, n: {"k": k, "n": n},
    ),
}


def batches(count: int, seed: int) -> list[Batch]:
    rng = random.Random(seed)
    return [
        {
            f"k{i:03d}": (None if rng.random() < 0.2 else rng.randrange(100))
            for i in rng.sample(range(30), 10)
        }
        for _ in range(count)
    ]


def truth(statement: str, committed: list[Batch], first: int, resumed: bool = False) -> Truth:
    """What a subscription that joined right before batch ``first`` delivers, per batch: a
    matching row; a deletion for a key delivered as a row before that no longer matches.
    One ``resumed`` from a position cannot know what its consumer holds: the first change
    of each key that does not match is a deletion too."""
    keep, project = STATEMENTS[statement]
    held: set[str] = set()
    unknown = {f"k{i:03d}" for i in range(30)} if resumed else set()
    out: Truth = {}
    for batch_id in range(first, len(committed)):
        for k, n in committed[batch_id].items():
            if n is not None and (keep is None or keep(k, n)):
                held.add(k)
                out.setdefault(batch_id, {})[k] = project(k, n)
            elif keep is None or k in held or k in unknown:
                held.discard(k)
                out.setdefault(batch_id, {})[k] = None
            unknown.discard(k)
    return out


def per_batch(changes: list[Change]) -> Truth:
    out: Truth = {}
    last = -1
    for change in changes:
        assert change.batch_id >= last, "batches out of order"
        last = change.batch_id
        rows = out.setdefault(change.batch_id, {})
        assert change.key not in rows, f"{change.key} twice in batch {change.batch_id}"
        rows[change.key] = change.row
    return out


def reached(sub: Subscription, batch_id: int) -> bool:
    return sub.position.partition_offsets("t").get(0, -1) >= batch_id


class Readers:
    """Subscriptions read three ways, each in its own way of waiting: change by change
    (a thread each), chunk by chunk (a thread each), and awaited on one event loop."""

    def __init__(self) -> None:
        self.got: dict[Subscription, list[Change]] = {}
        self.encoded: dict[Subscription, list[bytes]] = {}
        self.threads: list[threading.Thread] = []
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.loop_thread.start()
        self.tasks: list[Any] = []
        self.errors: list[BaseException] = []  # a reader's failure ends the wait at once

    def add(self, sub: Subscription, how: str) -> None:
        self.got[sub], self.encoded[sub] = [], []
        if how == "loop":
            self.tasks.append(asyncio.run_coroutine_threadsafe(self._awaited(sub), self.loop))
            return
        target = self._changes if how == "change" else self._chunks
        thread = threading.Thread(target=self._noted, args=(target, sub), daemon=True)
        thread.start()
        self.threads.append(thread)

    def _noted(self, target: Callable[[Subscription], None], sub: Subscription) -> None:
        try:
            target(sub)
        except BaseException as exc:
            self.errors.append(exc)
            raise

    def _changes(self, sub: Subscription) -> None:
        for change in sub:
            self.got[sub].append(change)

    def _chunks(self, sub: Subscription) -> None:
        while (chunk := sub.poll_chunk()) is not None:
            # a chunk holds whole batches: its position is after the last one, which may be
            # a later batch than its last change's (nothing of it matched)
            assert chunk.position.partition_offsets("t")[0] >= chunk.changes[-1].batch_id
            self.got[sub].extend(chunk.changes)
            self.encoded[sub].append(chunk.encoded(change_lines))

    async def _awaited(self, sub: Subscription) -> None:
        while True:
            chunk = await sub.poll_chunk_async(HANG_S)
            if chunk is None:
                return
            self.got[sub].extend(chunk.changes)
            self.encoded[sub].append(chunk.encoded(change_lines))

    def wait_for(self, subs: list[Subscription], batch_id: int) -> None:
        deadline = time.monotonic() + HANG_S
        while not all(reached(s, batch_id) for s in subs):
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, "subscribers never reached the last batch"
            time.sleep(0.02)

    def close(self) -> None:
        for sub in self.got:
            sub.close()
        for thread in self.threads:
            thread.join(HANG_S)
        for task in self.tasks:
            task.result(HANG_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(HANG_S)
        self.loop.close()


@pytest.fixture
def hub(tmp_path: Any) -> Iterator[SubscriptionHub]:
    hub = SubscriptionHub(str(tmp_path), poll_interval=0.005)
    yield hub
    hub.close()


def test_many_subscribers_with_different_predicates_each_get_exactly_their_changes(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    committed = batches(32, seed=5)
    ways = ("change", "chunk", "loop")
    readers = Readers()
    joined: list[tuple[Subscription, int, bool]] = []
    try:
        for first in (0, 8, 16, 24):
            # Joining once the tail has fanned out batch first - 1 starts with batch first:
            # each group holds other rows than the others, so their deletions differ; and
            # so do those resumed from a position (after batch first - 5: they catch up).
            group = [hub.subscribe(s) for s in STATEMENTS for _ in range(4 if first else 6)]
            joined += [(sub, first, False) for sub in group]
            if first:
                after = Position.from_map({"t": dict.fromkeys(range(4), first - 5)})
                resumed = [
                    hub.subscribe(s, from_position=after) for s in [*STATEMENTS, *STATEMENTS]
                ]
                joined += [(sub, first - 4, True) for sub in resumed]
                group += resumed
            for i, sub in enumerate(group):
                readers.add(sub, ways[i % 3])
            for batch_id in range(first, first + 8):
                write_batch(changelog, batch_id, committed[batch_id])
                hub.notify("t")
            readers.wait_for([sub for sub, _, _ in joined], first + 7)
    finally:
        readers.close()
    for sub, first, resumed in joined:
        got = readers.got[sub]
        assert per_batch(got) == truth(sub.statement, committed, first, resumed), sub.statement
        for change in got:
            assert change.token == change.position.to_token()
        if readers.encoded[sub]:  # the bytes an HTTP stream sends: one line per change
            lines = b"".join(readers.encoded[sub]).splitlines()
            assert [orjson.loads(line) for line in lines] == [
                {
                    "key": c.key,
                    "row": c.row,
                    "position": c.position.to_token(),
                    "batch_id": c.batch_id,
                    "snapshot": False,
                }
                for c in got
            ]


def test_resuming_from_a_change_token_inside_a_chunk_delivers_exactly_the_rest(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    committed = batches(6, seed=11)
    sub = hub.subscribe("SELECT * FROM t EMIT CHANGES")
    for batch_id, batch in enumerate(committed):
        write_batch(changelog, batch_id, batch)
    hub.notify("t")
    got: list[Change] = []
    while not reached(sub, len(committed) - 1):
        chunk = sub.poll_chunk(HANG_S)
        assert chunk is not None
        got.extend(chunk.changes)
    sub.close()
    assert per_batch(got) == truth("SELECT * FROM t EMIT CHANGES", committed, 0)
    for cut in (1, 13, len(got) // 2, len(got) - 1):
        resumed = hub.subscribe("SELECT * FROM t EMIT CHANGES", from_position=got[cut].token)
        rest: list[Change] = []
        while len(rest) < len(got) - cut - 1:
            chunk = resumed.poll_chunk(HANG_S)
            assert chunk is not None, f"resumed after change {cut}: got {len(rest)}"
            rest.extend(chunk.changes)
        assert resumed.poll_chunk(0.1) is None
        resumed.close()
        assert rest == got[cut + 1 :]


def test_a_slow_event_loop_consumer_fails_with_its_position_and_resumes(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    committed = batches(8, seed=3)
    statement = "SELECT * FROM t EMIT CHANGES"

    async def read(sub: Subscription) -> list[Change]:
        got: list[Change] = []
        chunk = await sub.poll_chunk_async(HANG_S)  # one batch, then stop reading
        assert chunk is not None
        got.extend(chunk.changes)
        for batch_id in range(1, len(committed)):
            write_batch(changelog, batch_id, committed[batch_id])
        hub.notify("t")
        deadline = time.monotonic() + HANG_S
        while hub.subscriptions().get("t") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the tail overflows the buffer and drops the subscription
        with pytest.raises(SlowConsumerError) as failed:
            while True:
                chunk = await sub.poll_chunk_async(HANG_S)
                assert chunk is not None
                got.extend(chunk.changes)
        assert failed.value.position == sub.position
        rest = hub.subscribe(statement, from_position=failed.value.position)
        while not reached(rest, len(committed) - 1):
            chunk = await rest.poll_chunk_async(HANG_S)
            assert chunk is not None
            got.extend(chunk.changes)
        rest.close()
        return got

    sub = hub.subscribe(statement, buffer_limit=15)
    write_batch(changelog, 0, committed[0])
    hub.notify("t")
    got = asyncio.run(read(sub))
    assert per_batch(got) == truth(statement, committed, 0)


def test_closing_or_stopping_wakes_an_awaiting_consumer(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    make_table(str(tmp_path))

    async def closed_by_another_thread() -> None:
        sub = hub.subscribe("SELECT * FROM t EMIT CHANGES")
        threading.Timer(0.1, sub.close).start()
        assert await sub.poll_chunk_async(HANG_S) is None  # woken by close, not the timeout
        assert sub.closed

    async def stopped_hub() -> None:
        sub = hub.subscribe("SELECT * FROM t EMIT CHANGES")
        threading.Timer(0.1, hub.close).start()
        with pytest.raises(SubscriptionError) as failed:
            await sub.poll_chunk_async(HANG_S)
        assert failed.value.position == Position.from_map({"t": dict.fromkeys(range(4), -1)})

    started = time.monotonic()
    asyncio.run(closed_by_another_thread())
    asyncio.run(stopped_hub())
    assert time.monotonic() - started < HANG_S  # neither waited for its timeout


def test_an_awaiting_consumer_times_out_with_none_and_keeps_its_changes(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))

    async def run() -> list[Change]:
        sub = hub.subscribe("SELECT * FROM t EMIT CHANGES")
        assert await sub.poll_chunk_async(0.05) is None  # nothing committed: a keep-alive
        write_batch(changelog, 0, {"a": 1, "b": None, "c": 3})
        hub.notify("t")
        chunk = await sub.poll_chunk_async(HANG_S)
        assert chunk is not None
        sub.close()
        return chunk.changes

    changes = asyncio.run(run())
    assert len(changes) == 3
    assert {c.key: c.row for c in changes} == {
        "a": {"k": "a", "n": 1},
        "b": None,
        "c": {"k": "c", "n": 3},
    }


def test_push_stream_sends_a_batch_larger_than_the_loop_encodes_as_lines(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    big = {f"big{i:05d}": i for i in range(ENCODE_ON_LOOP_MAX + 500)}

    async def run() -> list[dict[str, Any]]:
        sub = hub.subscribe("SELECT n FROM t WHERE n % 2 = 0 EMIT CHANGES")
        write_batch(changelog, 0, big)
        hub.notify("t")
        lines: list[dict[str, Any]] = []
        stream = push_stream(sub)
        async for body in stream:
            lines += [orjson.loads(line) for line in body.splitlines() if line]
            if len(lines) >= len(big) // 2:
                break
        await stream.aclose()
        assert sub.closed  # closing the stream closes the subscription
        return lines

    lines = asyncio.run(run())
    assert {line["key"]: line["row"] for line in lines} == {
        k: {"n": n} for k, n in big.items() if n % 2 == 0
    }
    tokens = [Position.from_token(line["position"]) for line in lines]
    assert [t.partition_offsets("push:t")[0] for t in tokens] == sorted(
        t.partition_offsets("push:t")[0] for t in tokens
    )
