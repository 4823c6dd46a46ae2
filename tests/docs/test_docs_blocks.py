"""Every fenced code block of README.md and docs/*.md is run, or explicitly marked as not
runnable with a reason (the conventions: tests/docs/blocks.py, docs/contributing-docs.md).

Python blocks run page by page, each page in a namespace of its own, in one interpreter that
starts Spark once (tests/docs/run_page.py); shell blocks (``sparkiq``, ``curl``,
``psql``) and SQL blocks run against a live ``sparkiq demo`` and a node with the Postgres
endpoint beside it (tests/docs/conftest.py).

The pages whose python blocks do not read the demo (tests.docs.blocks.uses_the_demo) run
first, before it starts: the demo streams three queries as long as it runs (a sixth to a
fifth of a core at a 10 s trigger), and those pages (attach, followers and kafka among
them) were half the time it ran. The demo starts with the first test that needs it; the
file's last test checks what it printed (the piped demo a user runs) and stops it."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import http_calls
from tests.docs.blocks import (
    COMMANDS,
    ROOT,
    SHELL_KINDS,
    Block,
    all_blocks,
    blocks_of,
    commands_of,
    doc_files,
    problems,
    program_of,
    substitute,
    uses_the_demo,
)
from tests.docs.conftest import Live, fill_page_dir, stop_demo
from tests.docs.run_page import DONE

BLOCKS = all_blocks()


def _python_texts(page: Path) -> list[str]:
    return [b.text for b in blocks_of(page) if b.kind == "python" and not b.no_run]


PAGES_WITH_PYTHON = [p for p in doc_files() if _python_texts(p)]
PAGES_ON_THEIR_OWN = [p for p in PAGES_WITH_PYTHON if not uses_the_demo(_python_texts(p))]
PAGES_ON_THE_DEMO = [p for p in PAGES_WITH_PYTHON if uses_the_demo(_python_texts(p))]
SHELL_BLOCKS = [b for b in BLOCKS if b.kind in SHELL_KINDS and not b.no_run]
SQL_BLOCKS = [b for b in BLOCKS if b.kind == "sql" and not b.no_run]


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_block_says_how_it_is_checked() -> None:
    wrong = [p for b in BLOCKS if (p := problems(b))]
    assert not wrong, "\n".join(wrong)


def test_blocks_that_do_not_run_are_counted_and_listed(capsys: pytest.CaptureFixture[str]) -> None:
    skipped = [b for b in BLOCKS if b.no_run]
    runs = [b for b in BLOCKS if not b.no_run and b.kind in {"python", "sql", *SHELL_KINDS}]
    report = [f"{len(runs)} code blocks run, {len(skipped)} marked no-run:"]
    report += [f"  {b.where} ({b.kind}): {b.reason}" for b in skipped]
    with capsys.disabled():
        print("\n" + "\n".join(report))
    for block in skipped:  # each found where the file has it
        fence = block.path.read_text().splitlines()[block.line - 1]
        assert fence.lstrip("`~").startswith(f"{block.kind} no-run:"), block.where


def test_json_blocks_parse() -> None:
    for block in BLOCKS:
        if block.kind == "json" and not block.no_run:
            try:
                json.loads(block.text)
            except ValueError as exc:
                pytest.fail(f"{block.where}: not JSON ({exc}); mark it 'text' if it is a sketch")


class Pages:
    """One ``python -m tests.docs.run_page --serve`` for the pages of this module: Spark
    starts once for all of them. Its working directory, ``cwd``, is emptied and filled
    afresh before each page (:func:`tests.docs.conftest.fill_page_dir`): Spark's JVM
    resolves relative paths against the directory it started in, so a page's ``orders/``
    or ``data/shop`` must be there, and must not be what an earlier page left."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.cwd = cwd
        self.log = log  # the runner's stderr: Spark's log, warnings
        self.env = env
        self.process: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()

    def _start(self) -> subprocess.Popen[str]:
        self.lines = queue.Queue()
        with self.log.open("a") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.docs.run_page", "--serve"],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        lines, out = self.lines, process.stdout
        assert out is not None

        def read() -> None:
            for line in out:
                lines.put(line)
            lines.put(None)  # the runner ended

        threading.Thread(target=read, daemon=True).start()
        return process

    def run(self, spec: Path, timeout: float) -> tuple[int | None, str]:
        """Run the page ``spec`` describes: its exit code (None: it did not finish within
        ``timeout`` s, or the runner died) and what it printed, then what the runner wrote
        on stderr meanwhile when the page failed. After a failure the runner is replaced,
        so that no later page runs beside what a failed one left behind."""
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        assert self.process.stdin is not None
        logged = self.log.stat().st_size
        self.process.stdin.write(f"{spec}\n")
        self.process.stdin.flush()
        printed: list[str] = []
        deadline = time.monotonic() + timeout
        code: int | None = None
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            if line.startswith(DONE):
                code = int(line[len(DONE) :])
                break
            printed.append(line)
        if code is None and self.process.poll() is None:
            self.process.kill()  # a hung page: what it printed is the clue, not its exit
        if code != 0:
            self.close()
            with self.log.open() as log:
                log.seek(logged)
                printed.append(f"\n--- stderr:\n{log.read()[-3000:]}")
        return code, "".join(printed)

    def close(self) -> None:
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()  # the runner stops Spark and exits
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    """The runner, started before the demo (for the pages that do not read it): its
    environment has no ``SPARKIQ_URL``, which a page reading the demo gets for its run."""
    root = tmp_path_factory.mktemp("docs-pages")
    (root / "page").mkdir()
    runner = Pages(root / "page", _env(None), root / "runner.log")
    try:
        yield runner
    finally:
        runner.close()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first one also starts the runner's Spark
@pytest.mark.parametrize("page", PAGES_ON_THEIR_OWN, ids=_id)
def test_python_blocks_without_the_demo(page: Path, pages: Pages, tmp_path: Path) -> None:
    _run_page(page, None, pages, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the first one also waits for the demo's first micro-batch
@pytest.mark.parametrize("page", PAGES_ON_THE_DEMO, ids=_id)
def test_python_blocks(page: Path, live: Live, pages: Pages, tmp_path: Path) -> None:
    _run_page(page, live, pages, tmp_path)


def _run_page(page: Path, live: Live | None, pages: Pages, tmp_path: Path) -> None:
    """Run a page's python blocks in the runner; ``live``: the demo the page reads."""
    # without the demo no address is replaced (uses_the_demo), only the directories
    http, pg_port = (live.http, live.pg_port) if live else ("", 0)
    blocks = [
        {"where": b.where, "text": substitute(b.text, http, pg_port)}
        for b in blocks_of(page)
        if b.kind == "python" and not b.no_run
    ]
    spec = tmp_path / "blocks.json"
    env = {"SPARKIQ_URL": live.url} if live else {}
    spec.write_text(json.dumps({"env": env, "blocks": blocks}))
    fill_page_dir(pages.cwd, live)
    # A page may start several Spark pipelines: minutes on a loaded machine. The bound
    # only turns a hang into a failure that shows how far the page got.
    code, printed = pages.run(spec, timeout=1500)
    assert code is not None, (
        f"{_id(page)}: the runner ended, or 1500 s passed, before the page was done; "
        f"it printed:\n{printed}"
    )
    assert code == 0, printed[-7000:]
    ran = [line[3:] for line in printed.splitlines() if line.startswith("ok ")]
    assert ran == [b["where"] for b in blocks], printed[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first one waits for the demo's Spark to serve (minutes, loaded)
@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_shell_blocks(block: Block, live: Live, page_dir: Path) -> None:
    for command in commands_of(block):
        program = program_of(command.text)
        assert program in COMMANDS, (
            f"{block.where}:{command.line}: {program!r} is not run by the docs test "
            f"({', '.join(sorted(COMMANDS))} are); mark the block 'no-run: why'"
        )
        line = substitute(command.text, live.http, live.pg_port)
        if "EMIT CHANGES" in line.upper():
            _run_push(block, command.line, line, live, page_dir)
            continue
        result = subprocess.run(
            ["bash", "-c", line],
            cwd=page_dir,
            env=_env(live),
            capture_output=True,
            text=True,
            timeout=120,
        )
        where = f"{block.where} (line {command.line}): {line}"
        printed = result.stdout + result.stderr
        error = _error_shown(command.output)
        if error is not None:  # the sample shows a failure: it must fail, saying that
            assert result.returncode != 0, f"{where}: succeeded; the docs show {error!r}"
            shown = substitute(error, live.http, live.pg_port)
            assert shown in printed.splitlines(), f"{where}: expected {shown!r}\n{printed}"
            continue
        assert result.returncode == 0, f"{where}\n{printed[-4000:]}"
        assert result.stdout.strip(), f"{where}: printed nothing"


def _error_shown(output: tuple[str, ...]) -> str | None:
    """The error line a sample's output shows (the first line), or None."""
    if output and re.match(r"(sparkiq \w+: |ERROR[: ]|psql: )", output[0]):
        return output[0]
    return None


@contextlib.contextmanager
def _ctrl_c_inherited() -> Iterator[None]:
    """Inside, a process started gets SIGINT as a terminal's Ctrl-C finds it: acted on. A
    test run started as a background job (``pytest ... &``) has SIGINT ignored, every child
    inherits that, and a push query would then never see the test's Ctrl-C. A handler (any)
    in this process becomes the default action in a child, as exec resets handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; pytest runs tests there
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


#: A push query's change as `sparkiq query` prints it: its batch first (a table's line or a
#: CSV record), or a JSON object (--json).
_CHANGE = re.compile(r"\d+ *[|,]|\{")


def _run_push(block: Block, line_no: int, line: str, live: Live, cwd: Path) -> None:
    """A push query runs until Ctrl-C: read its first changes, then send SIGINT."""
    with _ctrl_c_inherited():
        process = subprocess.Popen(
            ["bash", "-c", f"exec {line}"],
            cwd=cwd,
            env=_env(live),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        assert process.stdout is not None
        # The header (a table's also a rule) comes with the first change: up to it, not
        # the three lines that, in CSV, held a second change (one more trigger interval).
        lines: list[str] = []
        while len(lines) < 3 and not (lines and _CHANGE.match(lines[-1])):
            lines.append(process.stdout.readline())
            assert lines[-1], f"{block.where} (line {line_no}): the stream ended: {lines}"
        assert _CHANGE.match(lines[-1]), f"{block.where} (line {line_no}): no change: {lines}"
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0, f"{block.where} (line {line_no}): Ctrl-C did not end it"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first one waits for the demo's Spark to serve (minutes, loaded)
@pytest.mark.parametrize("block", SQL_BLOCKS, ids=lambda b: b.where)
def test_sql_blocks(block: Block, live: Live) -> None:
    response = http_calls.post(f"{live.url}/query", json={"sql": block.text}, timeout=60)
    assert response.status_code == 200, f"{block.where}: {response.text}"


def _env(live: Live | None) -> dict[str, str]:
    """The environment of a sample: this interpreter's ``sparkiq`` first on PATH, the live
    node (when given) as the default URL, and no token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKIQ_")}
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    if live is not None:
        env["SPARKIQ_URL"] = live.url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    env["PGCONNECT_TIMEOUT"] = "10"
    return env


def test_substitution_and_command_parsing() -> None:
    assert substitute("curl -s localhost:8081/x http://127.0.0.1:8081", "h:1", 7) == (
        "curl -s h:1/x http://h:1"
    )
    assert substitute("psql -h 127.0.0.1 -p 5433 x; 127.0.0.1:5433", "h:1", 7) == (
        "psql -h 127.0.0.1 -p 7 x; 127.0.0.1:7"
    )
    assert substitute('Node("/data/shop", local_dir="/var/lib/x") s3://b/data/', "h", 1) == (
        'Node("data/shop", local_dir="var/lib/x") s3://b/data/'
    )
    assert program_of("PGPASSWORD=s3cret psql -h x") == "psql"
    assert uses_the_demo(["x = 1", 'Node("demo-state")'])
    assert uses_the_demo(['http_calls.get("http://localhost:8081/stores")'])
    assert uses_the_demo(["conn = connect(port=5433)"])
    assert uses_the_demo(['os.environ["SPARKIQ_URL"]'])
    assert not uses_the_demo(['Node("/data/shop", listen="127.0.0.1:0")', "port=54330"])
    block = Block(ROOT / "README.md", 10, "console", False, "", "$ sparkiq a \\\n  b\nout\n")
    (command,) = commands_of(block)
    assert (command.line, command.text, command.output) == (11, "sparkiq a b", ("out",))
    assert shlex.split(command.text) == ["sparkiq", "a", "b"]


def test_the_page_runner_reports_a_failing_or_hung_page_and_starts_afresh(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # no live demo: the runner alone
    (tmp_path / "page").mkdir()
    runner = Pages(tmp_path / "page", env, tmp_path / "runner.log")

    def page(name: str, *texts: str, env: dict[str, str] | None = None) -> Path:
        spec = tmp_path / f"{name}.json"
        blocks = [{"where": f"{name}.md:{i}", "text": t} for i, t in enumerate(texts)]
        spec.write_text(json.dumps({"env": env or {}, "blocks": blocks}))
        return spec

    try:
        read_env = "import os; print(os.environ.get('DOCS_PAGE'))"
        good = page("good", "x = 6 * 7", "print(x)", read_env, env={"DOCS_PAGE": "good"})
        code, printed = runner.run(good, timeout=120)
        assert code == 0, printed
        assert [line for line in printed.splitlines() if not line.startswith("#")] == [
            "ok good.md:0",
            "42",
            "ok good.md:1",
            "good",  # the page's environment...
            "ok good.md:2",
        ]
        first = runner.process
        code, printed = runner.run(page("next", "print('x' in dir())", read_env), timeout=120)
        assert (code, runner.process) == (0, first), printed  # the same runner...
        assert "False" in printed.splitlines()  # ...and a namespace of the page's own
        assert "None" in printed.splitlines()  # ...and its environment (good's is gone)

        code, printed = runner.run(
            page(
                "bad", "import sys; print('to stderr', file=sys.stderr)", "1 / 0", "print('never')"
            ),
            timeout=120,
        )
        assert code == 1, printed
        assert "FAILED bad.md:1" in printed and "ZeroDivisionError" in printed
        assert "never" not in printed and "to stderr" in printed
        assert runner.process is None  # replaced before the next page

        code, printed = runner.run(page("after", "print('fresh')"), timeout=120)
        assert code == 0 and "fresh" in printed.splitlines()
        # a started runner: the first block prints at once, the second never ends (the
        # runner is warm from the page before: its first line takes milliseconds, and the
        # test waits the whole timeout)
        hung = page("hung", "print('started', flush=True)", "import time; time.sleep(600)")
        code, printed = runner.run(hung, timeout=5)
        assert code is None and "ok hung.md:0" in printed, printed
        assert runner.process is None  # killed, not waited for
    finally:
        runner.close()


#: A line of the demo's summary with its output piped: its batch, p-7's revenue and orders.
_UPDATE = re.compile(
    r"^\[\d\d:\d\d:\d\d\] batch (\d+) \| p-7 revenue ([\d.]+) \((\d+) orders\) \| top p-\d+ "
)


@pytest.mark.slow
def test_the_piped_demo_printed_its_console_first_kept_spark_quiet_and_stops_on_ctrl_c(
    live: Live,
) -> None:
    """``sparkiq demo`` as a user runs it with its output piped, checked on the demo the
    pages ran against (a second demo would be a Spark JVM of its own): the console's URL
    first, on a free port when the one it was told to use is taken, and how to point the
    other terminal at it; Spark's log in its file, none of it on the screen; live values;
    Ctrl-C (to the process group, as a terminal sends it) stops it cleanly.

    The last test of this file: it stops the demo (the fixture would at the package's end)."""
    console = http_calls.get(f"{live.url}/", timeout=10)
    assert console.status_code == 200 and "<html" in console.text.lower()
    assert stop_demo(live.demo) == 0, live.out.read_text()[-3000:] + live.err.read_text()
    out = live.out.read_text().splitlines()
    assert out[0] == f"sparkiq console: {live.url}/" and live.http != live.asked
    assert out[3] == (
        f"({live.asked} was taken: in your other terminal, export SPARKIQ_URL={live.url} and "
        "the sparkiq commands and getting-started's examples use this node)"
    ), out[:5]
    assert out[4] == "starting Spark..."
    log = live.root / "demo-state" / "logs" / "spark.log"
    assert f"Spark's log in {log}" in out[1]
    assert re.search(r"\b(WARN|INFO)\b", log.read_text())  # Spark's log went to its file...
    errors = live.err.read_text()
    noisy = [line for line in out + errors.splitlines() if re.search(r"\b(WARN|ERROR)\b", line)]
    assert noisy == [] and errors == ""  # ...and nothing of it to the screen
    values = [m for m in map(_UPDATE.match, out) if m]
    assert values, out
    assert int(values[-1].group(1)) >= int(values[0].group(1))  # later reads, later batches
    assert all(float(m.group(2)) > 0 and int(m.group(3)) > 0 for m in values)
    assert out[-2] == "stopping..." and out[-1].startswith("stopped."), out[-5:]
