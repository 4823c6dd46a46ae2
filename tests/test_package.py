"""Package-level promises: the public API, import layering, no import-time side effects."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sparkiq

SRC = Path(sparkiq.__file__).resolve().parent

# Lower layers first; a module may import its own layer and the layers before it.
LAYERS = [
    {"errors"},
    {"query"},
    {"schema"},
    {"stores"},
    {"changelog"},
    {"wire"},  # encodings of requests and results, shared by server, cluster and client
    {"sql"},  # the SQL engine runs over anything that answers StateQueryRequests
    {"cluster"},  # a node's rooms: hosting, lookups, routing, membership
    {"server"},  # the HTTP server, over anything that offers a node's methods
    {"node"},  # the Node facade assembles the rooms, SQL and the server
    {"spark"},  # the App embeds a node
    {"client"},
    {"cli", "demo", "testing", "__init__"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def top_level(module: Path) -> str:
    rel = module.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def sparkiq_imports(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sparkiq"):
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "sparkiq" and len(parts) > 1:
                    found.add(parts[1])
    return found


def test_dependencies_only_point_down() -> None:
    violations = []
    for module in SRC.rglob("*.py"):
        here = top_level(module)
        assert here in RANK, f"{module} is in no layer: add it to LAYERS"
        for target in sparkiq_imports(module):
            assert target in RANK, f"{module} imports unknown sparkiq.{target}"
            if RANK[target] > RANK[here]:
                violations.append(f"{module.relative_to(SRC)} imports sparkiq.{target}")
    assert violations == []


def test_only_the_spark_package_imports_pyspark() -> None:
    allowed = {"spark", "demo"}
    offenders = []
    for module in SRC.rglob("*.py"):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if (
                any(n.split(".")[0] == "pyspark" for n in names)
                and top_level(module) not in allowed
            ):
                offenders.append(str(module.relative_to(SRC)))
    assert offenders == []


def test_public_api_is_listed_and_importable() -> None:
    for name in sparkiq.__all__:
        assert hasattr(sparkiq, name), name
    assert sorted(sparkiq.__all__) == sorted(set(sparkiq.__all__))
    for contract in [
        "App",
        "Node",
        "StateQueryRequest",
        "KeyQuery",
        "RangeQuery",
        "WindowKeyQuery",
        "WindowRangeQuery",
        "Position",
        "PositionBound",
        "FailureReason",
        "ResultOrder",
    ]:
        assert contract in sparkiq.__all__


def test_import_starts_no_jvm_and_no_threads() -> None:
    code = (
        "import sys, threading, sparkiq; "
        "assert 'pyspark' not in sys.modules, 'pyspark imported'; "
        "assert threading.active_count() == 1, threading.enumerate()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
