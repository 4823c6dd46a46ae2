"""The writer's index of current keys (CurrentKeys) against a dict: lookups, moves, deletes
and inserts across the merges of its small run into its large one."""

from __future__ import annotations

import random

import numpy as np

from sparkiq.stores.keyindex import DELETED, CurrentKeys


def test_current_keys_answer_as_a_dict_across_merges_of_their_two_runs() -> None:
    rng = random.Random(11)
    model: dict[int, int] = {}  # hash -> location (DELETED once deleted)
    index = CurrentKeys.build(np.array([], np.int64), np.array([], np.int64))
    saw_two_runs = merged = False
    for step in range(300):
        known = list(model)
        touched = set(rng.sample(known, min(len(known), rng.randrange(0, 40))))
        fresh = {rng.getrandbits(63) - (1 << 62) for _ in range(rng.randrange(0, 60))} - set(model)
        queries = np.array(sorted(touched | fresh | {rng.getrandbits(62)}), np.int64)
        positions, found = index.find(queries)
        assert found.tolist() == [int(q) in model for q in queries], step
        assert index.locations_at(positions[found]).tolist() == [
            model[int(q)] for q in queries[found]
        ]
        update, update_locations, remove = [], [], []
        for position, query in zip(positions[found], queries[found], strict=True):
            if rng.random() < 0.3:
                remove.append(position)
                model[int(query)] = DELETED
            else:
                update.append(position)
                model[int(query)] = step * 1000 + len(update)
                update_locations.append(model[int(query)])
        inserted = np.array(sorted(fresh), np.int64)
        inserted_locations = np.arange(len(inserted), dtype=np.int64) + step * 1000 + 500
        model.update(zip(inserted.tolist(), inserted_locations.tolist(), strict=True))
        before = len(index.more_hashes)
        index.edit(
            np.array(update, np.int64),
            np.array(update_locations, np.int64),
            np.array(remove, np.int64),
            inserted,
            inserted_locations,
        )
        saw_two_runs |= len(index.more_hashes) > 0
        merged |= before > 0 and len(index.more_hashes) == 0
        assert len(index) == len(model)
        assert sorted(index.all_locations().tolist()) == sorted(model.values())
    assert saw_two_runs and merged
