"""Imports between the modules of ``sparkiq.sql`` (and the DDL module that uses them) go one
way: no circle, not even through ``TYPE_CHECKING`` or a function-level import."""

from __future__ import annotations

import ast
from pathlib import Path

import sparkiq

SRC = Path(sparkiq.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_edges() -> dict[str, set[str]]:
    """Every sparkiq module and the sparkiq modules it imports, anywhere in its text."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            found.update(t for t in targets if t in modules and t != name)
        edges[name] = found
    return edges


def reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), list(edges[start])
    while todo:
        here = todo.pop()
        if here == goal:
            return True
        if here not in seen:
            seen.add(here)
            todo.extend(edges[here])
    return False


def test_no_sql_module_and_no_ddl_module_is_in_an_import_circle() -> None:
    edges = import_edges()
    ddl = ["sparkiq.spark.ddl", "sparkiq.spark.ddl_run"]
    watched = [m for m in edges if m.startswith("sparkiq.sql.")] + ddl
    circles = [
        (module, target)
        for module in watched
        for target in edges[module]
        if target != "sparkiq.sql" and reaches(edges, target, module)
    ]
    assert circles == []
    assert "sparkiq.spark.app" not in edges["sparkiq.spark.ddl"]
    assert "sparkiq.spark.app" not in edges["sparkiq.spark.ddl_run"]
    assert "sparkiq.sql.push" not in edges["sparkiq.sql.subscription"]
