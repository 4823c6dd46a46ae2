"""The fenced code blocks of the docs, and the conventions that say how each is checked.

A block's info string is ``KIND`` optionally followed by ``no-run: REASON``:

- ``python``: run, with the page's other python blocks in order, in one namespace, in a
  fresh interpreter whose working directory holds the demo's ``demo-state``.
- ``bash`` (or ``sh``, ``shell``, ``console``): each command is run against the live demo.
  When some lines start with ``$ ``, those are the commands and the other lines show their
  output; otherwise every line is a command (``\\`` or an open quote continues a line,
  ``#`` starts a comment).
  A command must start with ``sparkiq``, ``curl`` or ``psql`` (after ``NAME=value``
  assignments); it must exit 0, unless the output shown under it is an error (``sparkiq
  query: ...``, ``ERROR: ...``, ``psql: ...``): then it must fail with that line. A push
  query (``EMIT CHANGES``) is stopped with Ctrl-C after its first changes.
- ``sql``: run with ``POST /query`` against the live demo.
- ``text``, ``json``, ``csv``, ``ini``, ``toml``, ``yaml``, ``markdown``: not code (output,
  diagrams, grammars, file layouts); ``json`` must parse.
- ``no-run: REASON`` after any kind: not run (a cluster deployment, a cloud bucket, a command
  that runs until stopped); the reason is required, and the test lists every such block.

In what runs, the addresses of the documented default node (``127.0.0.1:8081``,
``localhost:8081``) and Postgres endpoint (``127.0.0.1:5433``, ``-p 5433``, ``port=5433``)
stand for the live ones the test started, and ``/data/``, ``/var/lib/`` and ``/tmp/`` for
directories of the same names in the page's directory (:func:`substitute`). The page's
directory also holds a few input files the samples read: ``orders/``, ``events/`` and
``clicks/`` (JSON lines, see :data:`INPUTS`). A page whose python blocks name none of these
addresses, ``demo-state`` or ``SPARKIQ_URL`` runs before the demo starts, without it
(:func:`uses_the_demo`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_KINDS = frozenset({"python", "bash", "sh", "shell", "console", "sql"})
SHELL_KINDS = frozenset({"bash", "sh", "shell", "console"})
DATA_KINDS = frozenset({"text", "json", "csv", "ini", "toml", "yaml", "markdown"})
COMMANDS = frozenset({"sparkiq", "curl", "psql"})

_FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
_NO_RUN = re.compile(r"^no-run(?::\s*(.*))?$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its kind, whether it runs, and its text."""

    path: Path
    line: int  # of the opening fence, 1-based
    kind: str
    no_run: bool
    reason: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/ (new pages are picked up as added)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info = match.group(1), match.group(2).strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        kind, _, rest = info.partition(" ")
        no_run = _NO_RUN.match(rest.strip())
        out.append(
            Block(
                path=path,
                line=start + 1,
                kind=kind.lower(),
                no_run=bool(no_run),
                reason=(no_run.group(1) or "").strip() if no_run else "",
                text="\n".join(body) + "\n",
            )
        )
    return out


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in blocks_of(path)]


def problems(block: Block) -> str | None:
    """What is wrong with a block's info string, or None."""
    if not block.kind:
        return (
            f"{block.where}: a fenced block needs an info string: a language that runs "
            f"({', '.join(sorted(RUN_KINDS))}), one that is not code "
            f"({', '.join(sorted(DATA_KINDS))}), or 'KIND no-run: why' (docs/contributing-docs.md)"
        )
    if block.kind not in RUN_KINDS | DATA_KINDS:
        return f"{block.where}: unknown block kind {block.kind!r} (docs/contributing-docs.md)"
    if block.no_run and not block.reason:
        return f"{block.where}: 'no-run' needs a reason: 'no-run: why it cannot run'"
    return None


@dataclass(frozen=True)
class Command:
    line: int  # in the file
    text: str
    output: tuple[str, ...]  # the documented output lines that follow it


def commands_of(block: Block) -> list[Command]:
    """The commands of a shell block, continuation lines joined."""
    raw = block.text.splitlines()
    prompted = any(line.startswith("$ ") for line in raw)
    out: list[Command] = []
    i = 0
    while i < len(raw):
        line = raw[i]
        number = block.line + 1 + i
        i += 1
        if prompted and not line.startswith("$ "):
            if out:
                out[-1] = Command(out[-1].line, out[-1].text, (*out[-1].output, line))
            continue
        text = line[2:] if prompted else line
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        while i < len(raw) and (text.endswith("\\") or _open_quote(text)):
            if text.endswith("\\"):
                text = text[:-1].rstrip() + " " + raw[i].strip()
            else:  # a quoted argument spanning lines keeps its newlines
                text = text + "\n" + raw[i]
            i += 1
        out.append(Command(number, text.strip(), ()))
    return out


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:  # "No closing quotation"
        return True
    return False


def program_of(command: str) -> str:
    """The program a command line runs, after any ``NAME=value`` assignments."""
    for word in command.split():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", word):
            return word
    return ""


def substitute(text: str, http: str, pg_port: int) -> str:
    """``text`` with the documented default addresses replaced by the live ones (``http`` is
    ``host:port``), and the documented absolute directories (``/data/...``,
    ``/var/lib/...``, ``/tmp/...``) made relative to the page's directory."""
    text = re.sub(r"(?<![\w./:])/(data|var/lib|tmp)/", r"\1/", text)
    text = re.sub(r"\b(?:127\.0\.0\.1|localhost):8081\b", http, text)
    text = re.sub(r"\b127\.0\.0\.1:5433\b", f"127.0.0.1:{pg_port}", text)
    return re.sub(r"(-p\s+|\bport=)5433\b", rf"\g<1>{pg_port}", text)


def uses_the_demo(texts: list[str]) -> bool:
    """Whether samples (a page's python blocks) read the live demo: they name its
    ``demo-state``, ``SPARKIQ_URL`` or an address :func:`substitute` replaces. The docs test
    runs the other pages before the demo starts, so that its micro-batches take no CPU
    from them; a page counted out wrongly fails (no ``demo-state``, no node), it cannot pass
    unchecked."""
    for text in texts:
        if "demo-state" in text or "SPARKIQ_URL" in text:
            return True
        if substitute(text, "h:1", 1) != substitute(text, "h:2", 2):
            return True
    return False


#: Input folders a page's directory starts with (the sources the guide's samples read), as
#: ``{folder: [json line, ...]}``.
INPUTS: dict[str, list[str]] = {
    "orders": [
        '{"order_id": 1, "product": "p-17", "user_id": 7, "amount": 100.0, '
        '"ts": "2024-03-01T10:01:00", "status": "paid"}',
        '{"order_id": 2, "product": "p-17", "user_id": 8, "amount": 23.0, '
        '"ts": "2024-03-01T10:02:00", "status": "paid"}',
        '{"order_id": 3, "product": "p-3", "user_id": 7, "amount": 12.5, '
        '"ts": "2024-03-01T10:07:00", "status": "paid"}',
        '{"order_id": 4, "product": "p-1", "user_id": 9, "amount": 140.0, '
        '"ts": "2024-03-01T10:12:00", "status": "paid"}',
    ],
    "events": [
        '{"user": "ada", "page": "home", "ts": "2024-03-01T10:00:00"}',
        '{"user": "ada", "page": "cart", "ts": "2024-03-01T10:03:00"}',
        '{"user": "ada", "page": "home", "ts": "2024-03-01T10:15:00"}',
        '{"user": "bob", "page": "home", "ts": "2024-03-01T10:04:00"}',
    ],
    "clicks": [
        '{"click_id": 1, "product": "p-17"}',
        '{"click_id": 2, "product": "p-99"}',
    ],
}


def write_inputs(directory: Path) -> None:
    for folder, lines in INPUTS.items():
        (directory / folder).mkdir()
        (directory / folder / "1.json").write_text("\n".join(lines) + "\n")
