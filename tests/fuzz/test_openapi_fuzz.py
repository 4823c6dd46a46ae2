"""schemathesis against ``/openapi.json`` of a real node, with the token: every operation
gets generated requests (valid and invalid by the schema), a fixed seed, a few hundred
cases in all. No answer is a 5xx, errors leak no path or class name, and key lookups on
another connection keep answering meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation import GenerationMode

from sparkiq.server.openapi import openapi_document
from tests import http_calls
from tests.cluster.cluster_helpers import start_http_cluster
from tests.fuzz.harness import FuzzReport, judge_error
from tests.server.test_hostile import TOKEN, Hostile, Probe, auth
from tests.sql.tables import build_world

pytestmark = pytest.mark.timeout(300)

EXAMPLES = 25  # per operation: 13 operations, about 300 cases


@pytest.fixture(scope="module")
def api_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    state_dir = str(tmp_path_factory.mktemp("openapi-fuzz"))
    build_world(state_dir)
    (node,) = start_http_cluster(state_dir, 1, token=TOKEN)
    yield Hostile(node, state_dir)
    node.stop()


def operations() -> list[Any]:
    doc = openapi_document()
    return [result.ok() for result in schemathesis.openapi.from_dict(doc).get_all_operations()]


@pytest.mark.parametrize("operation", operations(), ids=lambda op: op.label)
def test_no_operation_answers_a_server_error(api_node: Hostile, operation: Any) -> None:
    """Requests valid by the schema and requests that break it, for one operation (the
    schema is this node's ``/openapi.json``, checked equal to the document here)."""
    served = http_calls.get(api_node.url("/openapi.json"), timeout=10).json()
    assert served == openapi_document()
    report = FuzzReport()
    strategy = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def one(case: Any) -> None:
        response = case.call(base_url=api_node.node.url, headers=auth(), timeout=60)
        report.cases += 1
        report.statuses[response.status_code] += 1
        if response.status_code >= 400:
            what = f"{case.method} {case.formatted_path} {str(case.body)[:200]}"
            judge_error(
                report, what, httpx.Response(response.status_code, content=response.content)
            )

    with Probe(api_node):
        one()
    # operations without parameters or body have one distinct request; the others many
    assert report.cases >= (EXAMPLES // 2 if _has_input(operation) else 1), report.statuses
    print(operation.label, dict(report.statuses))
    assert not report.problems, "\n".join(report.problems[:10])


def _has_input(operation: Any) -> bool:
    return bool(operation.path_parameters or operation.body or operation.query)
