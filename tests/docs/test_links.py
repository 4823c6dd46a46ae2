"""Links between the docs pages resolve: every relative link names a file of the repository
(never one outside it), and every ``#anchor`` names a heading of the page it points at."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but ``-`` and ``_``
    dropped, spaces made hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        name, n = base, 0
        while name in found:  # a repeated heading gets -1, -2, ...
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def broken_links(root: Path) -> list[str]:
    """``page: target (why)`` for every link that does not resolve."""
    broken = []
    for page in pages(root):
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:: outside the repository
                continue
            path_part, _, anchor = target.partition("#")
            where = f"{page.relative_to(root)}: {target}"
            linked = (page.parent / path_part).resolve() if path_part else page
            if not linked.is_relative_to(root):
                broken.append(f"{where} (outside the repository)")
            elif not linked.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{where} (no heading has this anchor)")
    return broken


def test_every_docs_link_resolves() -> None:
    assert broken_links(ROOT) == []


def test_the_link_check_would_catch_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[ok](docs/a.md#a-b_c) [image](docs/a.md)\n")
    (tmp_path / "docs" / "a.md").write_text(
        "# A: b_c\n\n## Twice\n\n## Twice\n\n"
        "[self](#twice-1) [gone](#nowhere) [web](https://example.com/x#y)\n"
        "[up](../../outside.md) [missing](b.md)\n"
        "```text\n[in a fence](#not-checked)\n```\n"
    )
    assert broken_links(tmp_path) == [
        "docs/a.md: #nowhere (no heading has this anchor)",
        "docs/a.md: ../../outside.md (outside the repository)",
        "docs/a.md: b.md (no such file)",
    ]
