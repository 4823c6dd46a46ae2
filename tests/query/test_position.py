"""Positions and bounds: merge laws, token round trips, and the bound rule."""

from __future__ import annotations

import random

import pytest

from sparkiq import Position, PositionBound


def random_position(rng: random.Random) -> Position:
    return Position.from_map(
        {
            rng.choice(["t", "u", "kafka:orders", "kafka:é/x"]): {
                rng.randrange(0, 16): rng.randrange(-1, 10**12) for _ in range(rng.randrange(1, 5))
            }
            for _ in range(rng.randrange(0, 4))
        }
    )


def test_map_and_token_round_trip_exactly() -> None:
    rng = random.Random(7)
    for _ in range(500):
        p = random_position(rng)
        assert Position.from_map(p.to_map()) == p
        assert Position.from_token(p.to_token()) == p
        assert Position.from_token(p.to_token()).to_map() == p.to_map()


def test_tokens_varying_one_offset_are_the_positions_tokens() -> None:
    # partitions past 9 sort as text in a token; source components sort around the varying one
    base = {
        "t": {p: 41 for p in range(12)},
        "kafka:in": {0: 7, 10: 3, 2: 12},
        "a": {"3": 1},  # a partition given as text is an int all the same
    }
    token = Position.tokens_varying(base, "push:t", 41)
    for n in (0, 1, 9, 10, 123456):
        expected = Position.from_map({**base, "push:t": {41: n}})
        assert token(n) == expected.to_token()
        assert Position.from_token(token(n)) == expected


def test_merge_is_entrywise_max_and_a_semilattice() -> None:
    rng = random.Random(11)
    for _ in range(300):
        a, b, c = (random_position(rng) for _ in range(3))
        merged = a.merge(b)
        assert merged == b.merge(a)
        assert a.merge(b).merge(c) == a.merge(b.merge(c))
        assert a.merge(a) == a
        assert merged.dominates(a) and merged.dominates(b)
        for component in a.components | b.components:
            for partition in set(a.partition_offsets(component)) | set(
                b.partition_offsets(component)
            ):
                expected = max(
                    a.partition_offsets(component).get(partition, -(10**18)),
                    b.partition_offsets(component).get(partition, -(10**18)),
                )
                assert merged.partition_offsets(component)[partition] == expected


def test_position_is_immutable_and_copies_its_input() -> None:
    source = {"t": {0: 1}}
    p = Position.from_map(source)
    source["t"][0] = 99
    assert p.to_map() == {"t": {0: 1}}
    p.to_map()["t"][0] = 42
    assert p.to_map() == {"t": {0: 1}}
    with pytest.raises(TypeError):
        p.partition_offsets("t")[0] = 5  # type: ignore[index]


@pytest.mark.parametrize("token", ["", "x", "p1.!!!", "p1." + "A" * 7, "p1.WzFd"])
def test_bad_tokens_are_refused_with_a_clear_message(token: str) -> None:
    with pytest.raises(ValueError, match="token"):
        Position.from_token(token)


def test_bad_maps_are_refused() -> None:
    with pytest.raises(ValueError, match="partition"):
        Position.from_map({"t": {"zero": 1}})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="component"):
        Position.from_map({"": {0: 1}})


def test_unbounded_admits_everything() -> None:
    assert PositionBound.unbounded().admits("t", Position.empty())


def test_table_batch_ids_are_a_table_wide_clock() -> None:
    # A token from partition 3 at batch 7 asks every partition of the table for batch 7.
    bound = PositionBound.at(Position.from_map({"t": {3: 7}}))
    assert bound.admits("t", Position.from_map({"t": {5: 7}}))
    assert bound.admits("t", Position.from_map({"t": {5: 9}}))
    assert not bound.admits("t", Position.from_map({"t": {5: 6}}))
    assert not bound.admits("t", Position.empty())


def test_source_components_compare_per_partition() -> None:
    bound = PositionBound.at(Position.from_map({"kafka:a": {0: 10, 1: 20}}))
    assert bound.admits("t", Position.from_map({"t": {0: 1}, "kafka:a": {0: 10, 1: 25}}))
    assert not bound.admits("t", Position.from_map({"t": {0: 1}, "kafka:a": {0: 9, 1: 25}}))
    assert not bound.admits("t", Position.from_map({"t": {0: 1}, "kafka:a": {0: 10}}))


def test_components_a_replica_does_not_track_do_not_constrain_it() -> None:
    bound = PositionBound.at(Position.from_map({"other_table": {0: 100}, "kafka:zzz": {0: 5}}))
    assert bound.admits("t", Position.from_map({"t": {0: 0}}))


def test_bound_needs_a_position() -> None:
    with pytest.raises(TypeError, match="Position"):
        PositionBound.at({"t": {0: 1}})  # type: ignore[arg-type]


# -- a producer's acknowledgements as a bound ------------------------------------------------


class _Message:
    """What confluent-kafka's delivery callback hands over: accessors are methods."""

    def __init__(self, topic: str, partition: int, offset: int, error: object = None) -> None:
        self._t, self._p, self._o, self._e = topic, partition, offset, error

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def error(self) -> object:
        return self._e


class _RecordMetadata:
    """What kafka-python's and aiokafka's send futures return: plain attributes."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset


def test_after_asks_for_each_partition_past_its_highest_record() -> None:
    bound = PositionBound.after(
        _Message("orders", 3, 1041),
        _RecordMetadata("orders", 3, 1040),
        ("orders", 0, 0),
        ("pay", 1, 7),
    )
    assert bound.position == Position.from_map(
        {"kafka:orders": {3: 1042, 0: 1}, "kafka:pay": {1: 8}}
    )
    assert bound.kafka_only
    assert PositionBound.after("orders", 3, 1041) == PositionBound.after(("orders", 3, 1041))
    assert Position.of_kafka_offsets("orders", {3: 1042}) == Position.from_map(
        {"kafka:orders": {3: 1042}}
    )


def test_after_admits_a_replica_once_it_read_past_the_record() -> None:
    bound = PositionBound.after("orders", 3, 1041)
    behind = Position.from_map({"t": {0: 5}, "kafka:orders": {3: 1041}})
    read = Position.from_map({"t": {0: 6}, "kafka:orders": {3: 1042}})
    assert not bound.admits("t", behind)
    assert bound.admits("t", read)


@pytest.mark.parametrize(
    ("ack", "error", "words"),
    [
        (_Message("orders", 0, -1001), ValueError, "has no offset"),
        (_Message("orders", 0, 5, error="MSG_TIMED_OUT"), ValueError, "not delivered"),
        (("", 0, 5), ValueError, "topic"),
        (("orders", -1, 5), ValueError, "partition"),
        (("orders", 0, True), ValueError, "has no offset"),
        (object(), TypeError, "acknowledged records"),
    ],
)
def test_after_refuses_what_is_not_an_acknowledged_record(
    ack: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        PositionBound.after(ack)
    with pytest.raises(ValueError, match="at least one"):
        PositionBound.after()


def test_merge_asks_for_both() -> None:
    a = PositionBound.after("orders", 0, 4)
    b = PositionBound.at(Position.from_map({"t": {1: 9}, "kafka:orders": {0: 2, 1: 3}}))
    assert a.merge(b).position == Position.from_map({"t": {1: 9}, "kafka:orders": {0: 5, 1: 3}})
    assert a.merge(PositionBound.unbounded()) == a
    assert PositionBound.unbounded().merge(a) == a
    assert not b.kafka_only
