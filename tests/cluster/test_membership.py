"""Membership as input and as judgement: heartbeats are validated field by field (in the
class and over HTTP), failure detection tolerates jitter but not silence, and a node's own
stall is not taken for the others' silence. Nodes here run ``membership="heartbeats"``
(not the default); gossip's counterparts are test_swim.py, test_gossip_cluster.py and
test_stalls.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkiq import Node
from sparkiq.cluster.detector import ArrivalWindow, Detector
from sparkiq.cluster.heartbeat import HeartbeatError, parse_heartbeat
from sparkiq.cluster.membership import Membership
from sparkiq.cluster.nodeauth import REQUEST_HEADER, NodeKey
from sparkiq.wire.values import pack
from tests import http_calls
from tests.changelog.helpers import make_table

TOKEN = "s3cret"
SECRET = "the-nodes-own-secret"


def beat(node_id: str = "n1", url: str = "http://127.0.0.1:9001", **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "node_id": node_id,
        "url": url,
        "started_at": 1700000000.5,
        "members": {},
        "hosted": {"t": {"0": [4, "live", 0], "3": [2, "restoring", 2]}},
    }
    return doc | changes


BAD = [
    ({"members": {"ghost": 5}}, "members"),
    ({"members": {"ghost": "https://10.0.0.9:443"}}, "members"),
    ({"members": {"": "http://127.0.0.1:9"}}, "members"),
    ({"members": ["n2"]}, "members"),
    ({"started_at": "abc"}, "started_at"),
    ({"started_at": float("nan")}, "started_at"),
    ({"started_at": True}, "started_at"),
    ({"node_id": 7}, "node_id"),
    ({"node_id": "x" * 129}, "node_id"),
    ({"node_id": " n1"}, "node_id"),
    ({"url": "https://127.0.0.1:9001"}, "url"),
    ({"url": "http://user:pw@127.0.0.1:9001"}, "url"),
    ({"url": "http://127.0.0.1:9001/steal?x=1"}, "url"),
    ({"url": "http://"}, "url"),
    ({"url": "http://127.0.0.1:99999"}, "url"),
    ({"url": None}, "url"),
    ({"hosted": {"t": {"0": [4, "bogus", 0]}}}, "hosted"),
    ({"hosted": {"t": {"x": [4, "live", 0]}}}, "hosted"),
    ({"hosted": {"t": {"0": [True, "live", 0]}}}, "hosted"),
    ({"hosted": {"t": {"0": [4, "live", -1]}}}, "hosted"),
    ({"hosted": {"t": {"0": [4, "live"]}}}, "hosted"),
    ({"hosted": {"t": [1, 2]}}, "hosted"),
    ({"hosted": "t"}, "hosted"),
    ({"groups": "t"}, "hosted"),
    ({"groups": {"t": [[4, "live", 0]]}}, "hosted"),
    ({"groups": {"t": [[4, "bogus", 0, [1]]]}}, "hosted"),
    ({"groups": {"t": [[4, "live", 0, [1, 1]]]}}, "hosted"),
    ({"groups": {"t": [[4, "live", 0, [2], [3]]]}}, "hosted"),
    ({"groups": {"t": [[4, "live", 0, [True]]]}}, "hosted"),
    ({"groups": {"t": [[4, "live", 0, [1 << 20]]]}}, "hosted"),
    ({"groups": {"t": [[-2, "live", 0, [1]]]}}, "hosted"),
    ({"groups": {"t": [[4, "live", 0, "1"]]}}, "hosted"),
    ({"v": 0}, "v"),
    ({"v": "2"}, "v"),
]


@pytest.mark.parametrize(("change", "field"), BAD, ids=[repr(c) for c, _ in BAD])
def test_every_malformed_field_is_refused_by_name(change: dict[str, Any], field: str) -> None:
    with pytest.raises(HeartbeatError) as caught:
        parse_heartbeat(beat(**change), "http")
    assert caught.value.field == field


def test_a_valid_heartbeat_parses_to_typed_values() -> None:
    parsed = parse_heartbeat(beat(members={"n2": "http://127.0.0.1:9002/"}), "http")
    assert parsed.node_id == "n1" and parsed.url == "http://127.0.0.1:9001"
    assert parsed.members == {"n2": "http://127.0.0.1:9002"}
    assert parsed.hosted == {"t": {0: (4, "live", 0), 3: (2, "restoring", 2)}}
    assert parsed.started_at == 1700000000.5
    local = parse_heartbeat(beat(url="local://n1"), "local")
    assert local.url == "local://n1"


def test_version_2_groups_carry_the_same_hosted_state_as_version_1() -> None:
    hosted = {"t": {0: (4, "live", 0), 3: (2, "restoring", 2), 5: (4, "live", 0)}, "u": {}}
    doc = Membership("n1", "http://127.0.0.1:9001", []).heartbeat_doc(hosted, groups=True)
    assert doc["v"] == 2 and "hosted" not in doc
    assert sorted(doc["groups"]["t"]) == [[2, "restoring", 2, [3]], [4, "live", 0, [0, 5]]]
    assert parse_heartbeat(doc, "http").hosted == hosted
    old = parse_heartbeat(beat(), "http")  # a node of the previous release: no "v"
    assert old.version == 1 and old.hosted == {"t": {0: (4, "live", 0), 3: (2, "restoring", 2)}}


def test_version_2_goes_only_to_members_that_read_it(tmp_path: Path) -> None:
    """A rolling upgrade keeps nodes that read only version 1 in the cluster: they are
    answered, and sent heartbeats, in version 1."""
    from sparkiq.testing import start_cluster

    make_table(str(tmp_path), partitions=4)
    with start_cluster(
        str(tmp_path), nodes=2, http=False, store="memory", membership="heartbeats"
    ) as cluster:
        coordinator = cluster[0].coordinator
        assert coordinator is not None
        old_node = beat("old", "local://old", hosted={})  # no "v": the previous release
        reply = coordinator.on_heartbeat(old_node)
        assert "hosted" in reply and "groups" not in reply and reply["v"] == 2
        assert "local://old" not in coordinator.membership.group_readers()
        new_node = beat("new", "local://new", v=2, groups={})
        reply = coordinator.on_heartbeat(new_node)
        assert "groups" in reply and "hosted" not in reply
        assert coordinator.membership.group_readers() >= {"local://new", "local://n1"}
        assert parse_heartbeat(reply, "local").hosted == cluster[0].hosted_state()


def test_one_bad_heartbeat_changes_nothing_and_poisons_nothing() -> None:
    membership = Membership("n0", "http://127.0.0.1:9000", ["127.0.0.1:9001"])
    membership.heard(beat())
    before = {k: (m.url, m.started_at) for k, m in membership.members().items()}
    for change, _ in BAD:
        with pytest.raises(HeartbeatError):
            membership.heard(beat(node_id="n2", url="http://127.0.0.1:9002") | change)
    assert {k: (m.url, m.started_at) for k, m in membership.members().items()} == before
    assert membership.targets() == ["http://127.0.0.1:9001"]
    membership.heard(beat(node_id="n2", url="http://127.0.0.1:9002"))  # later rounds still work
    assert membership.live() == ("n0", "n1", "n2")
    assert membership.targets() == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def test_seeds_of_another_scheme_are_not_called() -> None:
    membership = Membership(
        "n0", "http://127.0.0.1:9000", ["http://127.0.0.1:9001", "https://10.0.0.1:443"]
    )
    assert membership.targets() == ["http://127.0.0.1:9001"]


def test_second_hand_members_are_forgotten_unless_heard() -> None:
    membership = Membership("n0", "http://127.0.0.1:9000", [], forget_after=0.0)
    membership.heard(beat(members={"ghost": "http://127.0.0.1:1"}))
    assert "ghost" in membership.members()
    assert "ghost" not in membership.heartbeat_doc({})["members"]  # never heard: not gossiped
    membership.check()
    assert set(membership.members()) == {"n1"}
    assert "n1" in membership.heartbeat_doc({})["members"]


def arrivals(gaps: list[float]) -> ArrivalWindow:
    window, now = ArrivalWindow(), 0.0
    window.arrived(now, 10.0)
    for gap in gaps:
        now += gap
        window.arrived(now, 10.0)
    return window


def test_a_regular_member_is_judged_by_the_fixed_floor() -> None:
    detector = Detector(interval=0.1, floor=1.0)
    window = arrivals([0.1] * 50)
    assert not detector.gone(window, 0.99)
    assert detector.gone(window, 1.0)
    assert detector.deadline(window) == 1.0


def test_a_jittery_member_gets_more_time_but_not_forever() -> None:
    detector = Detector(interval=0.1, floor=1.0)
    jittery = arrivals([0.1, 0.9, 0.1, 0.8, 0.1, 1.0, 0.2, 0.7] * 6)
    assert not detector.gone(jittery, 1.5)  # a late heartbeat is not a dead node
    deadline = detector.deadline(jittery)
    assert 1.5 < deadline <= detector.ceiling == 5.0
    assert detector.gone(jittery, deadline + 0.01)
    assert detector.phi(jittery, 0.2) < detector.phi(jittery, 2.0) < detector.phi(jittery, 4.0)


def test_outages_are_not_sampled_as_jitter() -> None:
    window = ArrivalWindow()
    for t in (0.0, 0.1, 0.2, 10.2, 10.3):
        window.arrived(t, 1.0)
    assert [round(s, 6) for s in window.samples] == [0.1, 0.1, 0.1]


def test_this_nodes_own_stall_is_not_the_others_silence() -> None:
    membership = Membership(
        "n0", "http://127.0.0.1:9000", [], heartbeat_interval=0.1, failure_timeout=1.0
    )
    membership.heard(beat())
    membership.tick()
    member = membership.members()["n1"]
    member.last_heard -= 5.0  # type: ignore[operator]  # silent for 5 s ...
    membership.tick(time.monotonic() - 5.0)  # ... while this node's own loop did not run
    assert membership.live() == ("n0", "n1")
    membership.tick()  # the loop runs again (after its round): now the silence counts
    assert membership.live() == ("n0",)


@pytest.fixture
def http_node(tmp_path: Path) -> Iterator[Node]:
    make_table(str(tmp_path), partitions=2)
    node = Node(
        str(tmp_path),
        node_id="n0",
        listen="127.0.0.1:0",
        peers=[],
        token=TOKEN,
        cluster_secret=SECRET,
        heartbeat_interval=0.1,
        failure_timeout=1.0,
        membership="heartbeats",  # the heartbeat route (gossip's probes: test_gossip_cluster)
    ).start()
    yield node
    node.stop()


def post(node: Node, body: bytes, secret: str | None = SECRET) -> httpx.Response:
    """A heartbeat signed with ``secret`` (None: sent with the client token instead)."""
    headers = {"content-type": "application/x-sparkiq-v1"}
    if secret is None:
        headers["authorization"] = f"Bearer {TOKEN}"
    else:
        signed = NodeKey(secret).sign_request("n1", "POST", "/internal/heartbeat", body)
        headers[REQUEST_HEADER] = signed.header
    return http_calls.post(f"{node.url}/internal/heartbeat", content=body, headers=headers)


def test_the_heartbeat_route_answers_400_and_keeps_membership(http_node: Node) -> None:
    assert http_node.coordinator is not None
    membership = http_node.coordinator.membership
    for change, field in BAD:
        response = post(http_node, pack(beat(**change)))
        assert response.status_code == 400, (change, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_heartbeat" and error["field"] == field
        assert membership.members() == {}
    garbage = post(http_node, b"\xc1\xff not msgpack")
    assert garbage.status_code == 400 and garbage.json()["error"]["field"] == "body"
    # the client token admits no member; neither does another cluster's secret
    assert post(http_node, pack(beat()), secret=None).status_code == 401
    assert post(http_node, pack(beat()), secret="another-cluster-secret").status_code == 401
    assert membership.members() == {}
    good = post(http_node, pack(beat()))
    assert good.status_code == 200
    assert set(membership.members()) == {"n1"}
    assert membership.targets() == ["http://127.0.0.1:9001"]


def test_a_joining_node_opens_only_its_share_of_the_cluster(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node joining through one seed meets the members the seed names before its first
    assignment: on a view of the seed alone (or of itself, before the seed's reply was
    recorded) it opened -- restored -- every partition, then released most of them."""
    from sparkiq.cluster.transport import LocalTransport
    from sparkiq.testing import start_cluster

    state = str(tmp_path)
    make_table(state, partitions=24)
    with start_cluster(state, nodes=4, http=False, store="memory") as cluster:
        transport = cluster[0].coordinator.transport  # type: ignore[union-attr]
        assert isinstance(transport, LocalTransport)
        caplog.set_level("INFO", logger="sparkiq.node")
        joiner = Node(
            state,
            node_id="n4",
            transport=transport,
            peers=["local://n0"],
            store="memory",
            heartbeat_interval=0.1,
            failure_timeout=1.0,
        )
        cluster.nodes.append(joiner.start())
        cluster.settle()
        share = joiner.coordinator.assignment.hosted_by("n4", "t", 24)  # type: ignore[union-attr]
        opened = [r for r in caplog.records if r.getMessage().startswith("n4: now hosting")]
        assert 0 < len(share) < 24
        assert len(opened) == len(share), [r.getMessage() for r in opened]
