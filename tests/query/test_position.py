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
