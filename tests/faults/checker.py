"""The history checker: every recorded operation judged against the model's ground truth.

Anomalies (each is a bug, never load):

- ``wrong-value``: an answer differs from the table the model computes at the batch its
  position names (a key's ``n``, a range's rows, an aggregate).
- ``mixed-batches``: an answer spanning partitions whose partitions were read at different
  batches (consistent reads promise one batch, a state the table actually had).
- ``bound-violated``: an answer whose position is behind the bound it was asked with.
- ``went-back``: one client saw a partition at batch ``b`` and later at a batch below ``b``.
- ``uncommitted``: an answer at a batch the writer never committed.
- ``unclean-error``: a failure that is not a :class:`~sparkiq.errors.SparkiqError` (a crash
  in the client or a malformed answer).
- ``lost-batch``, ``batch-content``, ``committed-twice``: the changelog itself (see
  :func:`check_changelog`): batch ids not contiguous, a committed batch whose segments are not
  the model's changes, a batch committed after a later one (a re-run that rewrote it);
  ``snapshot-content``: a snapshot (the writer takes one every 100 batches) that is not the
  model's table at its batch.

Unavailability is reported per fault (:func:`windows`): failed operations, the longest time
no operation succeeded, and failures after the fault was healed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sparkiq.changelog import Changelog
from sparkiq.changelog.snapshot import list_snapshots, read_snapshot
from sparkiq.errors import CorruptSegmentError
from sparkiq.schema.keycodec import KeyCodec
from sparkiq.schema.rowcodec import RowCodec
from tests.faults.history import Op
from tests.faults.model import PARTITIONS, TABLE, Model, changes, partition_of


@dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: str
    op: Op | None = None

    def __str__(self) -> str:
        where = "" if self.op is None else f" [{self.op.client} {self.op.kind} {self.op.arg}]"
        return f"{self.kind}: {self.detail}{where}"


@dataclass(frozen=True)
class Fault:
    """A fault injected over ``[start, healed]`` (monotonic clock); ``settled`` is when the
    cluster was whole and ready again."""

    name: str
    start: float
    healed: float
    settled: float


@dataclass
class Window:
    """What clients saw from a fault's start until it settled."""

    fault: str
    ops: int = 0
    failed: int = 0
    longest_gap: float = 0.0  # the longest time in the window with no successful operation
    #: the longest time one client session went without an answer (a session whose entry
    #: node is cut off waits on it while the others' answers fill ``longest_gap``)
    client_gap: float = 0.0
    slowest: float = 0.0  # the longest one operation took (a session waiting on a dead node)
    failed_after_settle: int = 0
    errors: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"{self.fault}: {self.ops} ops, {self.failed} failed, longest gap "
            f"{self.longest_gap:.2f} s (one client {self.client_gap:.2f} s), slowest "
            f"{self.slowest:.2f} s, "
            f"{self.failed_after_settle} failed after settling"
        )


def _one_batch(op: Op) -> int | None:
    batches = set(op.position.values())
    return batches.pop() if len(batches) == 1 else None


def check_op(op: Op, model: Model, head: int | None) -> list[Anomaly]:
    """The anomalies of one operation on its own (``head``: the newest committed batch)."""
    if not op.ok:
        if op.error.startswith("UNEXPECTED"):
            return [Anomaly("unclean-error", op.error, op)]
        return []
    found = []
    for partition, bound in op.bound.items():
        if partition in op.position and op.position[partition] < bound:
            found.append(
                Anomaly(
                    "bound-violated",
                    f"partition {partition} at {op.position[partition]} < bound {bound}",
                    op,
                )
            )
    if head is not None and any(b > head for b in op.position.values()):
        found.append(Anomaly("uncommitted", f"position {op.position} beyond batch {head}", op))
        return found
    if op.kind == "get":
        assert op.arg is not None
        partition = partition_of(op.arg)
        if partition not in op.position:
            return [*found, Anomaly("wrong-value", f"no position for partition {partition}", op)]
        batch = op.position[partition]
        want = model.state(batch).get(op.arg)
        if op.value != want:
            found.append(Anomaly("wrong-value", f"{op.arg}={op.value} at {batch}, want {want}", op))
        return found
    batch = _one_batch(op)
    if batch is None or len(op.position) != PARTITIONS:
        return [*found, Anomaly("mixed-batches", f"position {op.position}", op)]
    state = model.state(batch)
    if op.kind == "range" and op.value != state:
        diff = sorted(set(op.value.items()) ^ set(state.items()))[:4]
        found.append(Anomaly("wrong-value", f"range at {batch} differs: {diff}", op))
    if op.kind == "sql" and list(op.value) != [len(state), sum(state.values()) if state else None]:
        found.append(
            Anomaly(
                "wrong-value",
                f"sql at {batch}: {op.value}, want {[len(state), sum(state.values())]}",
                op,
            )
        )
    return found


def check_history(ops: Iterable[Op], model: Model, head: int | None = None) -> list[Anomaly]:
    """Every anomaly in ``ops`` (any order; sessions are told apart by ``Op.client``)."""
    ops = sorted(ops, key=lambda o: (o.client, o.start))
    found = [a for op in ops for a in check_op(op, model, head)]
    for client, session in itertools.groupby(ops, key=lambda o: o.client):
        newest: dict[int, int] = {}
        for op in session:
            if not op.ok:
                continue
            for partition, batch in op.position.items():
                if batch < newest.get(partition, -1):
                    found.append(
                        Anomaly(
                            "went-back",
                            f"{client} partition {partition}: {newest[partition]} then {batch}",
                            op,
                        )
                    )
                newest[partition] = max(batch, newest.get(partition, -1))
    return found


def check_changelog(state_dir: str) -> tuple[int, list[Anomaly]]:
    """The newest committed batch, and the changelog's anomalies: every batch ``0..head``
    committed once, in order, each with exactly the model's changes."""
    changelog = Changelog(state_dir, TABLE, read_only=True)
    schema = changelog.manifest().schema
    keys, rows = KeyCodec(schema), RowCodec(schema)
    ids = changelog.committed_batch_ids()
    found = []
    if ids != list(range(len(ids))):
        missing = sorted(set(range(ids[-1] + 1)) - set(ids)) if ids else []
        found.append(Anomaly("lost-batch", f"batches {missing[:10]} were never committed"))
    previous_at = 0.0
    for batch_id in ids:
        record = changelog.read_commit(batch_id)
        assert record is not None
        if record.committed_at < previous_at:
            detail = f"batch {batch_id} committed after a later one"
            found.append(Anomaly("committed-twice", detail))
        previous_at = record.committed_at
        written: dict[str, int | None] = {}
        for partition in record.segments:
            encoded_keys, values = changelog.read_segment(record, partition)
            for key, value in zip(encoded_keys, values, strict=True):
                name = keys.from_internal(keys.decode(key))
                written[name] = None if value is None else rows.decode(value)["n"]
        if written != changes(batch_id):
            found.append(Anomaly("batch-content", f"batch {batch_id} is not the model's"))
    model = Model()
    for partition in range(PARTITIONS):
        for info in list_snapshots(changelog, partition):
            try:
                snapshot_keys, values = read_snapshot(changelog, info)
            except CorruptSegmentError as exc:  # written atomically: never torn
                found.append(Anomaly("snapshot-content", f"torn snapshot: {exc.message}"))
                continue
            state = {
                keys.from_internal(keys.decode(k)): rows.decode(v)["n"]
                for k, v in zip(snapshot_keys, values, strict=True)
            }
            if state != model.partition_state(info.batch_id, partition):
                detail = f"snapshot of partition {partition} at batch {info.batch_id}"
                found.append(Anomaly("snapshot-content", f"{detail} is not the model's"))
    return (ids[-1] if ids else -1), found


def _gap(ops: Iterable[Op], fault: Fault) -> float:
    """The longest time between ``fault.start`` and ``fault.settled`` with no answer in
    ``ops`` (answers are counted when they arrive)."""
    done = sorted(o.end for o in ops if o.ok and fault.start < o.end < fault.settled)
    marks = [fault.start, *done, fault.settled]
    return max(b - a for a, b in itertools.pairwise(marks))


def windows(ops: Sequence[Op], faults: Sequence[Fault]) -> list[Window]:
    """Per fault, what the clients saw between its start and the moment it settled."""
    out = []
    faults = sorted(faults, key=lambda f: f.start)
    for fault, following in itertools.zip_longest(faults, faults[1:]):
        until = float("inf") if following is None else following.start
        window = Window(fault.name)
        inside = [o for o in ops if fault.start <= o.start <= fault.settled]
        window.ops = len(inside)
        window.slowest = max((o.end - o.start for o in inside), default=0.0)
        failed = [o for o in inside if not o.ok]
        window.failed = len(failed)
        window.errors = sorted({o.error[:160] for o in failed})[:5]
        window.longest_gap = _gap(ops, fault)
        window.client_gap = max(
            (_gap([o for o in ops if o.client == c], fault) for c in {o.client for o in ops}),
            default=0.0,
        )
        window.failed_after_settle = sum(
            1 for o in ops if not o.ok and fault.settled < o.start < until
        )
        out.append(window)
    return out
