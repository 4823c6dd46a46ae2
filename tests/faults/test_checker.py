"""The checker finds every kind of anomaly it claims to (a checker that cannot fail proves
nothing), and finds none in a correct history."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sparkiq.changelog.snapshot import write_snapshot
from tests.changelog.helpers import make_table, write_batch
from tests.faults.checker import Fault, check_changelog, check_history, windows
from tests.faults.history import SQL, Op
from tests.faults.model import KEYS, PARTITIONS, TABLE, Model, changes, partition_of

MODEL = Model()


def get(key: str, batch: int, *, value: object = "truth", bound: int = -1, at: float = 0.0,
        client: str = "c0") -> Op:  # fmt: skip
    """A successful ``get`` of ``key`` at ``batch`` (the model's value unless ``value``)."""
    partition = partition_of(key)
    n = MODEL.state(batch).get(key) if value == "truth" else value
    return Op(client, "get", key, at, at + 0.01, ok=True, node="n0", value=n,
              position={partition: batch},
              bound={partition: bound} if bound >= 0 else {})  # fmt: skip


def everywhere(kind: str, batch: int, at: float = 0.0) -> Op:
    state = MODEL.state(batch)
    value = dict(state) if kind == "range" else [len(state), sum(state.values())]
    return Op("c0", kind, SQL if kind == "sql" else None, at, at + 0.01, ok=True, value=value,
              position=dict.fromkeys(range(PARTITIONS), batch))  # fmt: skip


def kinds(ops: list[Op], head: int | None = None) -> list[str]:
    return sorted({a.kind for a in check_history(ops, MODEL, head)})


def test_a_correct_history_has_no_anomaly() -> None:
    ops = [get(k, b, at=float(b)) for b in range(0, 40, 3) for k in KEYS[:5]]
    ops += [everywhere("range", 39, 50.0), everywhere("sql", 40, 51.0)]
    ops += [Op("c1", "get", KEYS[0], 60.0, 61.0, error="NodeUnreachableError: no node")]
    assert kinds(ops, head=40) == []


def test_the_model_changes_keys_deletes_some_and_keeps_some() -> None:
    assert MODEL.state(0) == {k: i for i, k in enumerate(KEYS)}
    state = MODEL.state(6)
    kept = [k for k, n in state.items() if n // 1000 < 6]
    deleted = [k for k in KEYS if k not in state]
    # worked by hand: batch 6 skips key 3 ((6 + 3) % 3 == 0), batch 5 wrote it
    assert state["k003"] == 5003
    assert kept and deleted, "batch 6 should leave some keys alone and delete others"


@pytest.mark.parametrize(
    ("ops", "kind"),
    [
        # a key's value from batch 4 served as batch 5 (which rewrote k000 as 5000)
        ([get(KEYS[0], 5, value=4000)], "wrong-value"),
        # a deleted key still answered
        ([get(next(k for k in KEYS if k not in MODEL.state(6)), 6, value=1)], "wrong-value"),
        # served behind the bound it was asked with
        ([get(KEYS[2], 4, bound=5)], "bound-violated"),
        # one session: a partition at 9, then at 8
        ([get(KEYS[3], 9, at=1.0), get(KEYS[3], 8, at=2.0)], "went-back"),
        # a batch the writer never committed
        ([get(KEYS[4], 12)], "uncommitted"),
        # a crash that is not a clean failure
        ([Op("c0", "get", KEYS[0], 0.0, 0.1, error="UNEXPECTED KeyError: 'n'")],
         "unclean-error"),
    ],
)  # fmt: skip
def test_each_anomaly_of_one_key_is_found(ops: list[Op], kind: str) -> None:
    assert kinds(ops, head=10) == [kind]


def test_two_clients_may_see_different_batches() -> None:
    ops = [get(KEYS[3], 9, at=1.0, client="c0"), get(KEYS[3], 8, at=2.0, client="c1")]
    assert kinds(ops) == []


def test_answers_spanning_partitions() -> None:
    mixed = everywhere("range", 8)
    mixed.position[0] = 7
    assert kinds([mixed]) == ["mixed-batches"]
    stale = everywhere("range", 8)
    stale.value = dict(MODEL.state(7))
    assert kinds([stale]) == ["wrong-value"]
    missing = everywhere("range", 8)
    missing.value = {k: n for k, n in MODEL.state(8).items() if partition_of(k) != 0}
    assert kinds([missing]) == ["wrong-value"]
    aggregate = everywhere("sql", 8)
    aggregate.value = [aggregate.value[0], aggregate.value[1] + 1]
    assert kinds([aggregate]) == ["wrong-value"]
    partial = everywhere("sql", 8)
    del partial.position[3]
    assert kinds([partial]) == ["mixed-batches"]


def test_the_changelog_check(tmp_path: Path) -> None:
    state_dir = str(tmp_path / "state")
    changelog = make_table(state_dir, TABLE, partitions=PARTITIONS)
    for batch_id in range(6):
        write_batch(changelog, batch_id, changes(batch_id))
    assert check_changelog(state_dir) == (5, [])

    write_batch(changelog, 3, changes(3))  # rewritten after batches 4 and 5
    assert [a.kind for a in check_changelog(state_dir)[1]] == ["committed-twice"]

    write_batch(changelog, 6, changes(7))  # batch 6 holds another batch's changes
    assert [a.kind for a in check_changelog(state_dir)[1]] == ["committed-twice", "batch-content"]

    os.remove(changelog.commit_path(2))  # a batch lost
    head, found = check_changelog(state_dir)
    assert head == 6
    assert found[0].kind == "lost-batch"
    assert "[2]" in found[0].detail


def test_snapshots_are_checked_against_the_model(tmp_path: Path) -> None:
    state_dir = str(tmp_path / "state")
    changelog = make_table(state_dir, TABLE, partitions=PARTITIONS)
    for batch_id in range(6):
        write_batch(changelog, batch_id, changes(batch_id))
    for partition in range(PARTITIONS):
        write_snapshot(changelog, partition, 5)
    assert check_changelog(state_dir) == (5, [])

    write_batch(changelog, 6, changes(7))  # wrong content, and so is the snapshot over it
    write_snapshot(changelog, 0, 6)
    found = sorted(a.kind for a in check_changelog(state_dir)[1])
    assert found == ["batch-content", "snapshot-content"]


def test_unavailability_windows() -> None:
    t = time.monotonic()
    ops = [
        get(KEYS[0], 1, at=t + 0.0),
        Op("c0", "get", KEYS[0], t + 1.0, t + 1.5, error="SparkiqError: down"),
        get(KEYS[0], 1, at=t + 3.0),  # ends at t + 3.01
        get(KEYS[0], 1, at=t + 4.0),
        Op("c0", "get", KEYS[0], t + 7.0, t + 7.5, error="SparkiqError: late"),  # after settling
        Op("c0", "get", KEYS[0], t + 12.0, t + 12.5, error="SparkiqError: next fault"),
    ]
    faults = [Fault("pause", t + 0.5, t + 4.5, t + 5.0), Fault("next", t + 11.0, t + 13, t + 14)]
    first, second = windows(ops, faults)
    assert (first.ops, first.failed, first.failed_after_settle) == (3, 1, 1)
    assert first.longest_gap == pytest.approx(2.51, abs=0.01)  # t + 0.5 .. t + 3.01
    assert first.errors == ["SparkiqError: down"]
    assert first.slowest == pytest.approx(0.5)
    assert (second.failed, second.failed_after_settle) == (1, 0)
