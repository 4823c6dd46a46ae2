"""Client load for cluster tests: key lookups against a table ``t`` whose rows carry the batch
id in ``n``, so every answer can be checked against its own position."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from sparkiq import Client, KeyQuery, StateQueryRequest, partition_for
from sparkiq.errors import SparkiqError


@dataclass
class Answer:
    sent: float
    done: float
    key: str
    partition: int
    ok: bool
    batch: int = -1
    consistent: bool = True
    error: str = ""


def query_key(client: Client, key: str) -> Answer:
    """One lookup of ``key`` in ``t``, recorded as an Answer (a failure is an answer too)."""
    request = StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(key))
    sent = time.monotonic()
    try:
        result = client.query(request)
    except SparkiqError as exc:
        return Answer(sent, time.monotonic(), key, -1, False, error=str(exc))
    done = time.monotonic()
    ((partition, answer),) = result.partition_results.items()
    if answer.is_failure:
        error = f"{answer.failure_reason}: {answer.failure_message}"
        return Answer(sent, done, key, partition, False, error=error)
    batch = answer.position.to_map()["t"][partition]
    consistent = answer.result is not None and answer.result["n"] == batch
    return Answer(sent, done, key, partition, True, batch, consistent)


#: Between two queries of a Load. Back to back, a client and the node answering it kept a
#: core each busy for the whole test (the kill and pause files ran at 1.1 cores), CPU the
#: suite's other workers need; 20 ms still gives dozens of answers a second per client, and
#: is a hundredth of the 2 s the failover and pause windows are judged against.
PAUSE_S = 0.02


def partitions_in_turn(keys: list[str], partitions: int, seed: int) -> Iterator[str]:
    """``keys`` of ``t`` (string keys, ``partitions`` partitions) forever, one of each
    partition in turn (the partitions' order and each one's keys shuffled by ``seed``): every
    partition is asked once every ``partitions`` queries. The tests judge unavailability per
    partition as the longest time without an answer for it; with keys drawn at random, a
    partition now and then went a second unasked on a loaded machine, and that counted."""
    rng = random.Random(seed)
    groups: dict[int, list[str]] = {}
    for key in keys:
        groups.setdefault(partition_for([key], ["string"], partitions), []).append(key)
    order = list(groups.values())
    rng.shuffle(order)
    for group in order:
        rng.shuffle(group)
    for turn in itertools.count():
        for group in order:
            yield group[turn % len(group)]


class Load(threading.Thread):
    """Queries the keys of ``t`` (``partitions`` partitions), each partition in turn and
    ``pause`` seconds apart, until stopped; records every answer. ``client`` is a Client,
    or a node's URL for a Client of the thread's own."""

    def __init__(
        self,
        client: Client | str,
        keys: list[str],
        partitions: int,
        seed: int = 7,
        pause: float = PAUSE_S,
    ) -> None:
        super().__init__(daemon=True)
        self.client, self.pause = client, pause
        self.keys = partitions_in_turn(keys, partitions, seed)
        self.answers: list[Answer] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        if isinstance(self.client, str):
            with Client(self.client) as client:
                self.query_until_stopped(client)
        else:
            self.query_until_stopped(self.client)

    def query_until_stopped(self, client: Client) -> None:
        for key in self.keys:
            if self.stop_event.is_set():
                return
            self.answers.append(query_key(client, key))
            self.stop_event.wait(self.pause)

    def stop(self) -> list[Answer]:
        self.stop_event.set()
        self.join()
        return self.answers
