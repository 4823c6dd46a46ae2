"""Package-level promises: the public API, import layering, no import-time side effects."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

import sparkiq

SRC = Path(sparkiq.__file__).resolve().parent

# Lower layers first; a module may import its own layer and the layers before it. A module's
# layer is its first path component under src/sparkiq ("__init__" is the top package itself).
LAYERS = [
    {
        "errors",
        "error_codes",
        "_version",
        "pools",
        "exports",
        "cancel",
        "tls",
        "principals",
        "envsettings",
        "limits",
    },
    {"query"},
    {"schema"},
    {"stores"},
    {"changelog"},
    {"publish"},  # a table's changelog produced to a Kafka topic (needs no Spark)
    {"checkpoint"},  # reads a Spark streaming checkpoint's state in place
    {"topics"},  # a Kafka topic followed as a table: record formats, placement, its source
    {"wire"},  # encodings of requests and results, shared by server, cluster and client
    {"sql"},  # the SQL engine runs over anything that answers StateQueryRequests
    {"serving"},  # one node's tables: config, hosting, lookups, followers, attached checkpoints
    {"cluster"},  # membership, assignment, routing, transports: no web framework, no SQL wiring
    {"server"},  # the HTTP server over anything that offers a node's methods
    {"node"},  # the Node facade assembles cluster, sql and server (may not exist yet)
    {"spark"},  # the App embeds a node
    {"client", "failover"},  # failover: which of a node's failures send a client elsewhere
    # `from sparkiq import X` runs sparkiq/__init__, which may import every layer (each public
    # name's module, when the name is first used): only the top layer may do it.
    {"cli", "output", "shell", "demo", "status_report", "testing", "__init__"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}

# Known violations, each removed by the branch that fixes it: the test fails while one is
# listed but gone, so whoever merges that branch deletes the entry.
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_CYCLES: set[frozenset[str]] = set()


def module_name(module: Path) -> str:
    parts = list(module.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level(module: Path) -> str:
    rel = module.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def is_module(dotted: str) -> bool:
    path = SRC.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@dataclass(frozen=True)
class Edge:
    """One sparkiq import written in a module, wherever it is (top, function, TYPE_CHECKING)."""

    target: str  # the module imported (a dotted name; "sparkiq" for the top package)
    line: int


def sparkiq_edges(module: Path) -> list[Edge]:
    """Every sparkiq module whose code importing `module` can run or read, as Python does it.

    `from sparkiq.pkg import name` reads the package `sparkiq.pkg` (its `__init__`), and the
    submodule `name` too where it is one; `from . import name` the same. Importing
    `sparkiq.other.mod` first runs `sparkiq.other`'s `__init__`: an edge to every package on
    the way that does not enclose `module` (the packages that enclose it are imported before
    it, so that step runs nothing).
    """
    tree = ast.parse(module.read_text())
    me = module_name(module)
    package = me.split(".")
    if module.name != "__init__.py":
        package = package[:-1]
    edges = []

    def add(target: str, line: int) -> None:
        parts = target.split(".")
        for end in range(2, len(parts)):
            outer = ".".join(parts[:end])
            if me != outer and not me.startswith(outer + "."):
                edges.append(Edge(outer, line))
        if target != me:  # a package's `from . import sub` reads itself: no edge
            edges.append(Edge(target, line))

    for node in ast.walk(tree):  # every node: lazy and TYPE_CHECKING imports count too
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], base]).strip(".")
            if base.split(".")[0] != "sparkiq":
                continue
            add(base, node.lineno)  # `from X import ...` runs X, whatever it names
            for alias in node.names:
                if is_module(f"{base}.{alias.name}"):
                    add(f"{base}.{alias.name}", node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sparkiq":
                    add(alias.name, node.lineno)
    return edges


def layer_of(target: str) -> str:
    parts = target.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations() -> set[tuple[str, str]]:
    found = set()
    for module in SRC.rglob("*.py"):
        here = top_level(module)
        assert here in RANK, f"{module} is in no layer: add it to LAYERS"
        for edge in sparkiq_edges(module):
            target = layer_of(edge.target)
            assert target in RANK, f"{module} imports unknown sparkiq.{target}"
            # `from sparkiq import X` is an import of the top package, the highest layer
            if RANK[target] > RANK[here]:
                found.add((str(module.relative_to(SRC)), target))
    return found


def test_dependencies_only_point_down() -> None:
    violations = layer_violations()
    assert violations - KNOWN_UPWARD == set()
    assert KNOWN_UPWARD - violations == set(), "fixed: delete these from KNOWN_UPWARD"


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in SRC.rglob("*.py"):
        name = module_name(module)
        graph.setdefault(name, set()).update(e.target for e in sparkiq_edges(module))
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components with more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in graph.get(name, ()):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == name:
                    break
            if len(component) > 1 or name in graph.get(name, ()):
                found.add(frozenset(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def cycle_edges(graph: dict[str, set[str]], cycle: frozenset[str]) -> list[str]:
    return [f"{a} -> {b}" for a in sorted(cycle) for b in sorted(graph[a] & cycle)]


def test_no_import_cycles_not_even_lazy_ones() -> None:
    """No loop, a package's `__init__` included: a module imports the module that defines a
    name (`from sparkiq.pkg.mod import name`, `import sparkiq.pkg.mod as mod`), never its own
    package (`from sparkiq.pkg import mod`, `from . import mod`), whose `__init__` re-exports
    it back."""
    graph = import_graph()
    found = cycles(graph)
    assert found - KNOWN_CYCLES == set(), [cycle_edges(graph, c) for c in found - KNOWN_CYCLES]
    assert KNOWN_CYCLES - found == set(), "fixed: delete these from KNOWN_CYCLES"


def test_the_fence_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checks above would catch what they claim to: a lazy import of the top package, a
    TYPE_CHECKING import, a relative import, and a circle through them; a module that imports
    its own package, whose `__init__` imports it back."""
    package = tmp_path / "sparkiq"
    (package / "query").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "query" / "__init__.py").write_text("")
    (package / "query" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    )
    (package / "query" / "b.py").write_text(
        "def f():\n    from sparkiq import Node\n    import sparkiq.query.a\n"
    )
    # a package's module reading its own package, whose __init__ imports it back
    (package / "stores").mkdir()
    (package / "stores" / "__init__.py").write_text("from .c import C\n")
    (package / "stores" / "c.py").write_text("from . import d\nC = 1\n")
    (package / "stores" / "d.py").write_text("import sparkiq.query.a\n")
    global SRC
    saved, SRC = SRC, package
    try:
        assert [e.target for e in sparkiq_edges(package / "query" / "a.py")] == ["sparkiq.query.b"]
        assert [e.target for e in sparkiq_edges(package / "query" / "b.py")] == [
            "sparkiq",
            "sparkiq.query.a",
        ]
        # `from . import d` reads the package and imports d; importing sparkiq.query.a from
        # another package runs sparkiq.query's __init__ first
        assert [e.target for e in sparkiq_edges(package / "stores" / "c.py")] == [
            "sparkiq.stores",
            "sparkiq.stores.d",
        ]
        assert [e.target for e in sparkiq_edges(package / "stores" / "d.py")] == [
            "sparkiq.query",
            "sparkiq.query.a",
        ]
        assert [e.target for e in sparkiq_edges(package / "stores" / "__init__.py")] == [
            "sparkiq.stores.c"
        ]
        assert layer_violations() == {("query/b.py", "__init__")}
        assert cycles(import_graph()) == {
            frozenset({"sparkiq.query.a", "sparkiq.query.b"}),
            frozenset({"sparkiq.stores", "sparkiq.stores.c"}),
        }
    finally:
        SRC = saved


def test_only_the_spark_package_imports_pyspark() -> None:
    allowed = {"spark", "demo", "testing"}
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


# The public API, written out so that every addition is deliberate (and reviewed with its
# docs). The contract's names (CONTRACT, below) must stay in it.
PUBLIC = [
    "App",
    "AuthPolicy",
    "AuthenticationError",
    "Change",
    "ChangelogError",
    "Client",
    "ConfigError",
    "CorruptSegmentError",
    "ErrorCode",
    "FailureReason",
    "Attached",
    "FollowedTopic",
    "Follower",
    "ForbiddenError",
    "HostInfo",
    "HttpLimits",
    "InvalidQueryError",
    "KeyQuery",
    "KeyQueryMetadata",
    "LayoutMismatchError",
    "MultiVersionedKeyQuery",
    "Node",
    "NodeConfig",
    "NodeMetadata",
    "NodeUnreachableError",
    "PartitionStore",
    "PgLimits",
    "Position",
    "PositionBound",
    "Query",
    "QueryContext",
    "QueryResult",
    "QuerySource",
    "RangeQuery",
    "ReadOnlyError",
    "ResultOrder",
    "RowIterator",
    "SchemaError",
    "SparkiqError",
    "SqlEngine",
    "SqlError",
    "SqlLimitError",
    "SqlLimits",
    "SqlPartitionError",
    "SqlResult",
    "SqlSyntaxError",
    "SqlUnknownNameError",
    "SqlUnsupportedError",
    "StateQueryRequest",
    "StateQueryResult",
    "StoreError",
    "SubscriptionHub",
    "Table",
    "UnknownStoreError",
    "VersionedKeyQuery",
    "VersionedRecord",
    "WindowKeyQuery",
    "WindowRangeQuery",
    "__version__",
    "enrich",
    "attach",
    "follow",
    "follow_topic",
    "partition_for",
    "register",
    "register_data_source",
    "spark_hash",
]
CONTRACT = [
    "App",
    "Node",
    "Client",
    "StateQueryRequest",
    "KeyQuery",
    "RangeQuery",
    "WindowKeyQuery",
    "WindowRangeQuery",
    "Position",
    "PositionBound",
    "FailureReason",
    "ResultOrder",
]
# Modules users import by name; every other sparkiq module is private.
PUBLIC_MODULES = {"testing"}


def test_public_api_is_the_written_list_and_importable() -> None:
    assert sorted(sparkiq.__all__) == sorted(PUBLIC)
    assert len(sparkiq.__all__) == len(set(sparkiq.__all__))
    for name in sparkiq.__all__:
        assert getattr(sparkiq, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from sparkiq import *", namespace)
    assert set(PUBLIC) <= set(namespace)
    assert set(CONTRACT) <= set(PUBLIC)
    assert sparkiq.__version__ == importlib.metadata.version("sparkiq")


DOCS = SRC.parents[1] / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
REFERENCE = re.compile(r"\bsparkiq((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def doc_pages() -> list[Path]:
    # design.md is written for contributors and names private modules on purpose.
    pages = [SRC.parents[1] / "README.md", *sorted(DOCS.glob("*.md"))]
    return [p for p in pages if p.name != "design.md"]


def private_references(text: str) -> list[str]:
    """``sparkiq.<module>`` references in the code of a markdown text that name a private
    module, and names imported from or read off ``sparkiq`` in Python blocks that are not in
    ``__all__``."""
    found = []
    code = [body for _, body in FENCE.findall(text)] + INLINE.findall(FENCE.sub("", text))
    for snippet in code:
        for match in REFERENCE.finditer(snippet):
            first = match.group(1).split(".")[1]
            if is_module(f"sparkiq.{first}") and first not in PUBLIC_MODULES:
                found.append(f"sparkiq.{first}")
    for language, body in FENCE.findall(text):
        if language != "python":
            continue
        for match in REFERENCE.finditer(body):
            first = match.group(1).split(".")[1]
            public = first in sparkiq.__all__ or first in PUBLIC_MODULES
            if not public and not is_module(f"sparkiq.{first}"):
                found.append(f"sparkiq.{first}")
        for match in re.finditer(r"from sparkiq import (\([^)]*\)|[^\n]*)", body):
            names = match.group(1).strip("()").replace("\n", " ").split(",")
            for name in (n.split(" as ")[0].strip() for n in names):
                if name and name not in sparkiq.__all__ and name not in PUBLIC_MODULES:
                    found.append(f"from sparkiq import {name}")
    return found


def test_docs_and_readme_show_only_public_names() -> None:
    offenders = {}
    for page in doc_pages():
        found = private_references(page.read_text())
        if found:
            offenders[page.name] = sorted(set(found))
    assert offenders == {}


def test_the_docs_check_would_catch_private_names() -> None:
    text = (
        "Use `sparkiq.spark.enrich` or `sparkiq.format = 1`.\n\n"
        "```python\nimport sparkiq.wire\nfrom sparkiq import (App,\n    Nope)\n"
        "sparkiq.App; sparkiq.Hidden\nfrom sparkiq.testing import spark_session\n```\n"
        "```\nINFO sparkiq.replica: restoring\n```\n"
    )
    assert sorted(private_references(text)) == [
        "from sparkiq import Nope",
        "sparkiq.Hidden",
        "sparkiq.spark",
        "sparkiq.wire",
    ]


def test_spark_code_works_with_spark_connect() -> None:
    """What users run against any session (App, enrich, the testing kit) reaches Spark
    through the DataFrame API only: Spark Connect has no SparkContext, RDDs or py4j."""
    classic_only = {"sparkContext", "SparkContext", "_jvm", "_jsc", "_jdf", "rdd", "py4j"}
    offenders = []
    for module in [
        *sorted((SRC / "testing").glob("*.py")),
        SRC / "spark" / "lookup.py",
        SRC / "spark" / "datasource.py",
    ]:
        for node in ast.walk(ast.parse(module.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                names = [part for n in names for part in n.split(".")]
            if classic_only.intersection(names):
                offenders.append(f"{module.relative_to(SRC)}:{node.lineno}")
    assert offenders == []


def lazy_packages() -> list[Path]:
    return sorted(p for p in SRC.rglob("__init__.py") if "_HOMES" in p.read_text())


def test_lazy_packages_name_each_export_once_in_all_three_lists() -> None:
    """A lazy package names its exports three times: ``_HOMES`` (what runs), the
    ``TYPE_CHECKING`` imports (what type checkers see) and ``__all__``; they must agree."""
    assert {p.parent.name for p in lazy_packages()} == {"sparkiq", "spark", "sql", "testing"}
    for init in lazy_packages():
        tree = ast.parse(init.read_text())
        homes: dict[str, tuple[str, ...]] = {}
        checked: dict[str, tuple[str, ...]] = {}
        listed: list[str] = []
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        for node in tree.body:
            if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "_HOMES":
                assert node.value is not None
                homes = ast.literal_eval(node.value)
            elif isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
                listed = ast.literal_eval(node.value)
            elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                for item in node.body:
                    assert isinstance(item, ast.ImportFrom), ast.unparse(item)
                    checked[str(item.module)] = tuple(a.name for a in item.names)
        assert homes == checked, init
        exported = sorted(name for names in homes.values() for name in names)
        assert sorted(set(listed) - {"__version__"} - defined) == exported, init


def test_a_lazy_package_loads_a_module_when_a_name_is_first_read() -> None:
    code = """
import sys, sparkiq, sparkiq.sql
assert "sparkiq.node" not in sys.modules
assert "Node" in dir(sparkiq) and "SqlEngine" in dir(sparkiq.sql)
node = sparkiq.Node
assert "sparkiq.node" in sys.modules and sparkiq.Node is node
# the engine registers SQL fragments with the wire protocol; a node answers them
from sparkiq.sql import SqlEngine
assert "sparkiq.sql.fragment" in sys.modules
try:
    sparkiq.Nope
except AttributeError as e:
    assert str(e) == "module 'sparkiq' has no attribute 'Nope'", e
else:
    raise AssertionError("sparkiq.Nope")
"""
    subprocess.run([sys.executable, "-c", code], check=True)


# What the command line and a client-only script must not load: the SQL engine, the stores,
# the HTTP server (``sparkiq --help`` took 0.9 CPU-s, 12 s on a busy machine, loading them).
HEAVY = ["duckdb", "sqlglot", "rocksdict", "uvicorn", "sparkiq.node"]


@pytest.mark.parametrize(
    "module, heavy",
    [("sparkiq.cli", [*HEAVY, "pyarrow", "httpx"]), ("sparkiq.client", HEAVY)],
)
def test_the_command_line_and_the_client_load_only_what_they_use(
    module: str, heavy: list[str]
) -> None:
    code = f"import sys, {module}; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    assert out.stdout.decode().strip() == "[]"


def test_import_starts_no_jvm_and_no_threads() -> None:
    code = (
        "import sys, threading, sparkiq, sparkiq.testing; "
        "assert 'pyspark' not in sys.modules, 'pyspark imported'; "
        "assert threading.active_count() == 1, threading.enumerate()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# How src/ uses each runtime dependency of pyproject.toml: the module it imports or, for a
# library that another one loads by name, the source text that names it. A new dependency
# needs an entry here, and an unused one fails the test.
IMPORTED = "import"
RUNTIME_DEPENDENCIES = {
    "pyspark": (IMPORTED, "pyspark"),
    "pyarrow": (IMPORTED, "pyarrow"),
    # PySpark's mapInArrow runs through pandas_udf, which requires pandas (an optional
    # dependency of pyspark itself)
    "pandas": ("mapInArrow", "spark"),
    "numpy": (IMPORTED, "numpy"),
    "rocksdict": (IMPORTED, "rocksdict"),
    "msgspec": (IMPORTED, "msgspec"),
    "mmh3": (IMPORTED, "mmh3"),
    "sqlglot": (IMPORTED, "sqlglot"),
    "duckdb": (IMPORTED, "duckdb"),
    "uvicorn": (IMPORTED, "uvicorn"),
    # uvicorn's fast HTTP parser, whose protocol the server extends with its limits, and
    # uvicorn's fast event loop, which the server asks uvicorn for by name
    "httptools": ("httptools_impl", "server"),
    "uvloop": ('find_spec("uvloop")', "server"),
    "orjson": (IMPORTED, "orjson"),
    "prometheus-client": (IMPORTED, "prometheus_client"),
    "pygwire": (IMPORTED, "pygwire"),
    "rich": (IMPORTED, "rich"),
    "prompt-toolkit": (IMPORTED, "prompt_toolkit"),
    "cramjam": (IMPORTED, "cramjam"),
    "xxhash": (IMPORTED, "xxhash"),
    "crc32c": (IMPORTED, "crc32c"),
    "python-lzf": (IMPORTED, "lzf"),
    "fastavro": (IMPORTED, "fastavro"),
    "protobuf": (IMPORTED, "google"),
    "pygal": (IMPORTED, "pygal"),
}


def declared_dependencies() -> set[str]:
    pyproject = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())
    names = set()
    for requirement in pyproject["project"]["dependencies"]:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, requirement
        names.add(match.group(0).lower().replace("_", "-"))
    return names


def imported_modules() -> set[str]:
    found = set()
    for module in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
    return found


def test_every_runtime_dependency_is_used_by_src() -> None:
    assert declared_dependencies() == set(RUNTIME_DEPENDENCIES)
    imported = imported_modules()
    unused = []
    for distribution, (how, what) in RUNTIME_DEPENDENCIES.items():
        if how == IMPORTED:
            used = what in imported
        else:
            used = any(how in m.read_text() for m in (SRC / what).rglob("*.py"))
        if not used:
            unused.append(distribution)
    assert unused == []


def test_no_module_is_over_700_lines_and_one_over_600_says_why() -> None:
    """One concept per module: past 600 lines a module's docstring says why it holds
    together (the words "Over 600 lines" or "over 600 lines"), and none passes 700."""
    too_long, unexplained = [], []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        lines = text.count("\n")
        name = str(path.relative_to(SRC))
        if lines > 700:
            too_long.append(f"{name} ({lines})")
        elif lines > 600 and "over 600 lines" not in text.lower():
            unexplained.append(f"{name} ({lines})")
    assert not too_long, f"modules over 700 lines: {too_long}"
    assert not unexplained, f"modules over 600 lines without a reason: {unexplained}"
