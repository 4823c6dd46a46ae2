"""Push queries (``SELECT ... EMIT CHANGES``) against changelogs written by hand while a
subscriber reads: what a subscriber receives is compared with the batches committed."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sparkiq.changelog.retention import apply_retention
from sparkiq.changelog.snapshot import write_snapshot
from sparkiq.errors import UnknownStoreError
from sparkiq.query.position import Position
from sparkiq.sql.push import (
    Change,
    PositionExpiredError,
    PushQueryError,
    SlowConsumerError,
    Subscription,
    SubscriptionError,
    SubscriptionHub,
)
from tests.changelog.helpers import expected_rows, make_table, write_batch

Batch = dict[str, int | None]
TAIL = "sparkiq-push-t"


@pytest.fixture
def hub(tmp_path: Any) -> Iterator[SubscriptionHub]:
    hub = SubscriptionHub(str(tmp_path), poll_interval=0.005)
    yield hub
    hub.close()


def random_batches(count: int, *, keys: int = 40, size: int = 12, seed: int = 1) -> list[Batch]:
    rng = random.Random(seed)
    out: list[Batch] = []
    for _ in range(count):
        chosen = rng.sample(range(keys), size)
        out.append(
            {f"k{i:03d}": (None if rng.random() < 0.2 else rng.randrange(100)) for i in chosen}
        )
    return out


def writer(changelog: Any, batches: list[Batch], first: int = 0) -> threading.Thread:
    """Commit ``batches`` from another thread, with short pauses, while the test reads."""

    def run() -> None:
        for i, batch in enumerate(batches):
            write_batch(changelog, first + i, batch)
            time.sleep(0.002)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def take(sub: Subscription, count: int, timeout: float = 10.0) -> list[Change]:
    out = []
    while len(out) < count:
        change = sub.poll(timeout)
        assert change is not None, f"got {len(out)} of {count} changes: {out[-3:]}"
        out.append(change)
    return out


def drain(sub: Subscription, through: int, timeout: float = 30.0) -> list[Change]:
    """Every change up to and including batch ``through`` of table t (committed already).
    Waits on the subscription's position, not on a pause in the stream: a busy machine can
    pause a stream that has more to deliver. ``timeout`` is a hang bound."""
    out = []
    deadline = time.monotonic() + timeout
    while sub.position.partition_offsets("t").get(0, -1) < through:
        change = sub.poll(max(0.0, deadline - time.monotonic()))
        assert change is not None, f"stuck at {sub.position} before batch {through}"
        out.append(change)
    # A batch's changes are queued together, so the rest of the last one are already here.
    while (change := sub.poll(0.15)) is not None:
        assert change.batch_id == through, change
        out.append(change)
    return out


def quiet(sub: Subscription, wait: float = 0.15) -> None:
    """Nothing more arrives."""
    extra = sub.poll(wait)
    assert extra is None, extra


def flat(changes: list[Change]) -> list[tuple[int, Any, Any]]:
    return [(c.batch_id, c.key, c.row) for c in changes]


def expected_all(batches: list[Batch], first: int = 0) -> list[tuple[int, Any, Any]]:
    """Every change as committed, batch by batch (compared per batch as sets: within a
    batch the order is by partition and key bytes)."""
    return [
        (first + i, k, None if n is None else {"k": k, "n": n})
        for i, batch in enumerate(batches)
        for k, n in batch.items()
    ]


def by_batch(rows: list[tuple[int, Any, Any]]) -> dict[int, dict[Any, Any]]:
    out: dict[int, dict[Any, Any]] = {}
    for batch_id, key, row in rows:
        assert key not in out.setdefault(batch_id, {}), f"{key} twice in batch {batch_id}"
        out[batch_id][key] = row
    return out


def filtered(
    batches: list[Batch], keep: Callable[[str, int], bool], project: Callable[[str, int], Any]
) -> dict[int, dict[Any, Any]]:
    """Ground truth for a WHERE: a row that stops matching is a deletion if delivered before."""
    held: set[str] = set()
    out: dict[int, dict[Any, Any]] = {}
    for batch_id, batch in enumerate(batches):
        for k, n in batch.items():
            if n is not None and keep(k, n):
                held.add(k)
                out.setdefault(batch_id, {})[k] = project(k, n)
            elif k in held:
                held.discard(k)
                out.setdefault(batch_id, {})[k] = None
    return out


def test_live_subscriber_sees_exactly_the_committed_changes_in_order(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {"old": 1})  # before the subscription: not delivered
    batches = random_batches(40)
    with hub.subscribe("SELECT * FROM t EMIT CHANGES") as sub:
        thread = writer(changelog, batches, first=1)
        want = expected_all(batches, first=1)
        got = take(sub, len(want))
        thread.join()
        quiet(sub)
    assert by_batch(flat(got)) == by_batch(want)
    ids = [c.batch_id for c in got]
    assert ids == sorted(ids)  # commit order, hence per key order
    last = got[-1].position
    assert max(last.partition_offsets("t").values()) == 40
    assert sub.position.partition_offsets("t") == dict.fromkeys(range(4), 40)
    assert sub.closed and sub.poll(0) is None


def test_where_and_projection(tmp_path: Any, hub: SubscriptionHub) -> None:
    changelog = make_table(str(tmp_path))
    batches = random_batches(30, seed=2)
    sub = hub.subscribe(
        "select k, n * 2 as twice, n % 7 from T where n >= 40 and (k like 'k0%' or n in (3, 5))"
        "  emit   changes ;"
    )
    assert sub.columns == ("k", "twice", "n % 7")
    thread = writer(changelog, batches)

    def keep(k: str, n: int) -> bool:
        return n >= 40 and (k.startswith("k0") or n in (3, 5))

    want = filtered(batches, keep, lambda k, n: {"k": k, "twice": 2 * n, "n % 7": n % 7})
    got = take(sub, sum(len(b) for b in want.values()))
    thread.join()
    quiet(sub)
    sub.close()
    assert by_batch(flat(got)) == want
    assert any(c.row is None for c in got)  # rows that stopped matching came as deletions


def test_snapshot_is_the_table_at_one_batch_then_the_changes(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    history = random_batches(12, seed=3)
    for i, batch in enumerate(history):
        write_batch(changelog, i, batch)
        if i == 6:
            for p in range(4):  # the cut is built from a snapshot plus later segments
                write_snapshot(changelog, p, 6)
    sub = hub.subscribe("SELECT * FROM t EMIT CHANGES", snapshot=True)
    table = expected_rows(history)
    first = take(sub, len(table))
    assert all(c.snapshot and c.batch_id == 11 for c in first)
    assert {c.key: c.row for c in first} == table
    assert sub.position == Position.from_map({"t": dict.fromkeys(range(4), 11)})
    more = random_batches(10, seed=4)
    thread = writer(changelog, more, first=12)
    got = take(sub, sum(len(b) for b in more))
    thread.join()
    quiet(sub)
    sub.close()
    assert by_batch(flat(got)) == by_batch(expected_all(more, first=12))
    assert not any(c.snapshot for c in got)


def test_snapshot_with_where_then_leaving_rows_are_deleted(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {"a": 10, "b": 60, "c": 70})
    sub = hub.subscribe("SELECT k FROM t WHERE n > 50 EMIT CHANGES", snapshot=True)
    assert sorted((c.key, c.row) for c in take(sub, 2)) == [("b", {"k": "b"}), ("c", {"k": "c"})]
    write_batch(changelog, 1, {"a": 20, "b": 10, "c": None, "d": 5})
    assert sorted((c.key, c.row) for c in take(sub, 2)) == [("b", None), ("c", None)]
    write_batch(changelog, 2, {"a": 99, "b": 1})  # b left already: no second deletion
    assert flat(take(sub, 1)) == [(2, "a", {"k": "a"})]
    quiet(sub)
    sub.close()


def test_snapshot_from_a_position_is_the_table_at_that_batch(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    history = random_batches(8, seed=5)
    for i, batch in enumerate(history):
        write_batch(changelog, i, batch)
    at = Position.from_map({"t": {0: 4}})
    with hub.subscribe("SELECT * FROM t EMIT CHANGES", snapshot=True, from_position=at) as sub:
        table = expected_rows(history[:5])
        assert {c.key: c.row for c in take(sub, len(table))} == table
        got = take(sub, sum(len(b) for b in history[5:]))
        assert by_batch(flat(got)) == by_batch(expected_all(history[5:], first=5))
        quiet(sub)


def test_resume_from_tokens_loses_and_repeats_nothing(tmp_path: Any, hub: SubscriptionHub) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {"a": 1})
    statement = "SELECT * FROM t WHERE n < 90 EMIT CHANGES"
    reference = hub.subscribe(statement)
    # Both subscribed before the writer starts: a subscription begins after the batch it
    # was made at, and on a busy machine batch 1 could otherwise land between the two.
    sub = hub.subscribe(statement)
    batches = random_batches(40, seed=6)
    thread = writer(changelog, batches, first=1)
    rng = random.Random(7)
    pieces: list[Change] = []
    token = None
    deadline = time.monotonic() + 20
    while thread.is_alive() or len(pieces) < 5:
        assert time.monotonic() < deadline
        for _ in range(rng.randrange(1, 15)):
            change = sub.poll(0.05)
            if change is None:
                break
            pieces.append(change)
        # disconnect mid-batch (a change's token) or between batches (the subscription's)
        use_change = pieces and rng.random() < 0.5
        token = pieces[-1].position.to_token() if use_change else sub.position.to_token()
        sub.close()
        sub = hub.subscribe(statement, from_position=token)
    thread.join()
    pieces += drain(sub, through=len(batches))
    sub.close()
    full = drain(reference, through=len(batches))
    reference.close()
    # A resumed subscription may add deletions for keys it cannot know the consumer lacks;
    # every other change is delivered exactly once, in order.
    assert [x for x in flat(pieces) if x[2] is not None] == [
        x for x in flat(full) if x[2] is not None
    ]
    deletions = {(b, k) for b, k, r in flat(pieces) if r is None}
    assert {(b, k) for b, k, r in flat(full) if r is None} <= deletions
    assert len(deletions) == len([x for x in flat(pieces) if x[2] is None])  # none repeated


def test_resume_without_where_is_exact(tmp_path: Any, hub: SubscriptionHub) -> None:
    changelog = make_table(str(tmp_path))
    batches = random_batches(10, seed=8)
    for i, batch in enumerate(batches):
        write_batch(changelog, i, batch)
    start = Position.from_map({"t": {0: -1}})  # before the first batch
    sub = hub.subscribe("SELECT * FROM t EMIT CHANGES", from_position=start)
    got = take(sub, 17)
    sub.close()
    resumed = hub.subscribe("SELECT * FROM t EMIT CHANGES", from_position=got[-1].position)
    got += take(resumed, sum(len(b) for b in batches) - 17)
    quiet(resumed)
    resumed.close()
    assert sorted(flat(got), key=lambda x: x[0]) == flat(got)
    assert by_batch(flat(got)) == by_batch(expected_all(batches))


def test_token_behind_retention_is_refused_naming_the_oldest_batch(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    for i, batch in enumerate(random_batches(7, seed=9)):
        write_batch(changelog, i, batch)
    for p in range(4):
        write_snapshot(changelog, p, 4)
    report = apply_retention(changelog, 0, now=time.time() + 60)
    assert report.commits == 5
    old = Position.from_map({"t": {0: 1}})
    with pytest.raises(PositionExpiredError) as info:
        hub.subscribe("SELECT * FROM t EMIT CHANGES", from_position=old.to_token())
    assert info.value.code == "position_expired" and info.value.position == old
    message = info.value.message
    assert "batch 2" in message and "oldest batch still there is 5" in message, message
    assert "snapshot" in message
    # a snapshot start still works, and a token inside retention resumes
    inside = Position.from_map({"t": {0: 4}})
    with hub.subscribe("SELECT * FROM t EMIT CHANGES", from_position=inside) as sub:
        assert {c.batch_id for c in take(sub, len(random_batches(7, seed=9)[5]))} == {5}


def test_slow_consumer_hits_the_bound_and_can_resume(tmp_path: Any, hub: SubscriptionHub) -> None:
    changelog = make_table(str(tmp_path))
    sub = hub.subscribe("SELECT * FROM t EMIT CHANGES", buffer_limit=50)
    batches = [{f"k{b}-{i}": i for i in range(20)} for b in range(6)]
    for i, batch in enumerate(batches):
        write_batch(changelog, i, batch)
    deadline = time.monotonic() + 5
    while sub._failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(SlowConsumerError) as info:
        sub.poll(1)
    error = info.value
    assert error.code == "slow_consumer"
    assert "buffer_limit=50" in error.message and "from_position" in error.message
    assert hub.subscriptions() == {}  # the tail stopped: its only subscriber is gone
    sub.close()
    resumed = hub.subscribe("SELECT * FROM t EMIT CHANGES", from_position=error.position)
    got = take(resumed, 120)
    resumed.close()
    assert by_batch(flat(got)) == by_batch(
        [(b, k, {"k": k, "n": n}) for b, batch in enumerate(batches) for k, n in batch.items()]
    )


def test_hundreds_of_subscribers_share_one_tail(tmp_path: Any, hub: SubscriptionHub) -> None:
    changelog = make_table(str(tmp_path))
    statements = ["SELECT * FROM t EMIT CHANGES", "SELECT k FROM t WHERE n >= 50 EMIT CHANGES"]
    subs = [hub.subscribe(statements[i % 2]) for i in range(250)]
    assert [t.name for t in threading.enumerate()].count(TAIL) == 1
    assert hub.subscriptions() == {"t": 250}
    batches = random_batches(8, seed=10)
    for i, batch in enumerate(batches):
        write_batch(changelog, i, batch)
    everything = by_batch(expected_all(batches))
    matching = filtered(batches, lambda k, n: n >= 50, lambda k, n: {"k": k})
    for i, sub in enumerate(subs):
        want = everything if i % 2 == 0 else matching
        got = take(sub, sum(len(b) for b in want.values()))
        assert by_batch(flat(got)) == want
    for sub in subs:
        sub.close()
    deadline = time.monotonic() + 5
    while TAIL in [t.name for t in threading.enumerate()] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert TAIL not in [t.name for t in threading.enumerate()]
    assert hub.subscriptions() == {}


def test_close_is_idempotent_and_ends_iteration(tmp_path: Any, hub: SubscriptionHub) -> None:
    changelog = make_table(str(tmp_path))
    sub = hub.subscribe("SELECT * FROM t EMIT CHANGES")
    write_batch(changelog, 0, {"a": 1})
    seen = []
    timer = threading.Timer(0.3, sub.close)
    timer.start()
    for change in sub:  # blocks until close() from the timer thread ends it
        seen.append(change.key)
    timer.join()
    assert seen == ["a"]
    sub.close()
    sub.close()
    assert sub.closed and sub.poll(0.01) is None and list(sub) == []


def test_poll_times_out_for_keep_alives(tmp_path: Any, hub: SubscriptionHub) -> None:
    make_table(str(tmp_path))
    with hub.subscribe("SELECT * FROM t EMIT CHANGES") as sub:
        started = time.monotonic()
        assert sub.poll(0.1) is None
        assert 0.09 <= time.monotonic() - started < 1.0


def test_hub_close_fails_open_subscriptions_with_a_resume_position(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    make_table(str(tmp_path))
    sub = hub.subscribe("SELECT * FROM t EMIT CHANGES")
    hub.close()
    with pytest.raises(SubscriptionError, match="node stopped") as info:
        sub.poll(1)
    assert info.value.position == sub.position
    with pytest.raises(SubscriptionError, match="closed"):
        hub.subscribe("SELECT * FROM t EMIT CHANGES")


def test_complete_mode_tables_deliver_only_what_changed(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path), mode="complete")
    write_batch(changelog, 0, {"a": 1, "b": 2})
    with hub.subscribe("SELECT * FROM t EMIT CHANGES", snapshot=True) as sub:
        assert {c.key: c.row["n"] for c in take(sub, 2) if c.row} == {"a": 1, "b": 2}
        write_batch(changelog, 1, {"a": 1, "b": 3, "c": 4})  # a unchanged
        assert sorted(flat(take(sub, 2))) == [
            (1, "b", {"k": "b", "n": 3}),
            (1, "c", {"k": "c", "n": 4}),
        ]
        write_batch(changelog, 2, {"c": 4})  # a and b gone
        assert sorted(flat(take(sub, 2))) == [(2, "a", None), (2, "b", None)]
        quiet(sub)


@pytest.mark.parametrize(
    ("statement", "fragment"),
    [
        ("SELECT * FROM t", "does not end with EMIT CHANGES"),
        ("SELECT k, count(*) FROM t GROUP BY k EMIT CHANGES", "GROUP"),
        ("SELECT * FROM t ORDER BY k LIMIT 3 EMIT CHANGES", "LIMIT, ORDER"),
        ("SELECT * FROM t JOIN u ON t.k = u.k EMIT CHANGES", "JOINS"),
        ("SELECT nope FROM t EMIT CHANGES", "unknown column 'nope'; columns are ['k', 'n']"),
        ("SELECT * FROM t WHERE n IN (SELECT 1) EMIT CHANGES", "IN takes a list"),
        ("SELECT * FROM t WHERE k LIKE k EMIT CHANGES", "string literal pattern"),
        ("SELECT * FROM t WHERE n = 'x' EMIT CHANGES", "cannot compare n (num) with 'x' (str)"),
        ("SELECT * FROM t WHERE upper(k) = sqrt(n) EMIT CHANGES", "is not supported"),
        ("SELECT FROM WHERE EMIT CHANGES", "cannot parse push query at line 1"),
        ("INSERT INTO t VALUES (1) EMIT CHANGES", "got a INSERT statement"),
        ("SELECT k, n AS k FROM t EMIT CHANGES", "duplicate output column names ['k']"),
        ("SELECT * FROM db.t EMIT CHANGES", "without a schema"),
    ],
)
def test_bad_statements_say_what_is_supported(
    tmp_path: Any, hub: SubscriptionHub, statement: str, fragment: str
) -> None:
    make_table(str(tmp_path))
    with pytest.raises(PushQueryError) as info:
        hub.subscribe(statement)
    assert fragment in info.value.message, info.value.message


def test_bad_arguments(tmp_path: Any, hub: SubscriptionHub) -> None:
    make_table(str(tmp_path))
    with pytest.raises(UnknownStoreError, match="'nope'"):
        hub.subscribe("SELECT * FROM nope EMIT CHANGES")
    with pytest.raises(PushQueryError, match="not a sparkiq position token"):
        hub.subscribe("SELECT * FROM t EMIT CHANGES", from_position="garbage")
    with pytest.raises(PushQueryError, match="no offsets for table 't'"):
        hub.subscribe(
            "SELECT * FROM t EMIT CHANGES", from_position=Position.from_map({"u": {0: 1}})
        )
    with pytest.raises(PushQueryError, match="buffer_limit"):
        hub.subscribe("SELECT * FROM t EMIT CHANGES", buffer_limit=0)
    assert hub.subscriptions() == {}


def test_joining_while_batches_commit_gives_an_exact_cut_then_every_later_change(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    """Snapshot and resumed subscriptions catch up from the changelog while the shared tail
    moves on; the hand-over must neither drop nor repeat a batch."""
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {"seed": 1})
    keep = hub.subscribe("SELECT * FROM t EMIT CHANGES")  # the tail runs throughout
    batches = random_batches(60, seed=11)
    history = [{"seed": 1}, *batches]
    thread = writer(changelog, batches, first=1)
    joined: list[tuple[str, Subscription]] = []
    while thread.is_alive() and len(joined) < 8:
        time.sleep(0.03)
        joined.append(("snapshot", hub.subscribe("SELECT * FROM t EMIT CHANGES", snapshot=True)))
        at = Position.from_map({"t": {0: 0}})
        joined.append(("resumed", hub.subscribe("SELECT * FROM t EMIT CHANGES", from_position=at)))
    thread.join()
    assert len(joined) >= 4
    final = expected_rows(history)
    for kind, sub in joined:
        state: dict[Any, Any] = {} if kind == "snapshot" else expected_rows(history[:1])
        cut = 0
        changes = []
        for change in drain(sub, through=len(batches)):
            if change.snapshot:
                cut = change.batch_id
                state[change.key] = change.row
            else:
                changes.append(change)
        sub.close()
        for change in changes:
            if change.row is None:
                state.pop(change.key, None)
            else:
                state[change.key] = change.row
        assert state == final, kind
        after = cut if kind == "snapshot" else 0
        want = expected_all(history[after + 1 :], first=after + 1)
        assert by_batch(flat(changes)) == by_batch(want), kind
        assert [c.batch_id for c in changes] == sorted(c.batch_id for c in changes)
    keep.close()


def test_resumed_where_sends_each_unknown_key_one_deletion(
    tmp_path: Any, hub: SubscriptionHub
) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {"a": 1})
    at = Position.from_map({"t": {0: 0}})
    with hub.subscribe("SELECT k FROM t WHERE n > 50 EMIT CHANGES", from_position=at) as sub:
        write_batch(changelog, 1, {"a": 2, "b": 60})  # a: unknown to the consumer
        write_batch(changelog, 2, {"a": 3})  # a: known absent now
        write_batch(changelog, 3, {"a": 70, "b": 1})
        write_batch(changelog, 4, {"a": 4, "b": 2})
        got = take(sub, 5)
        quiet(sub)
    assert by_batch(flat(got)) == {
        1: {"a": None, "b": {"k": "b"}},
        3: {"a": {"k": "a"}, "b": None},
        4: {"a": None},
    }
