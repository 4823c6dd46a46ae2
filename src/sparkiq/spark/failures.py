"""Why a table's Spark query failed, said in a few lines instead of Spark's exception text.

When a micro-batch fails, Spark stops the query and reports a ``StreamingQueryException``
whose text nests everything the failure went through: Spark's own prefix, the Python
traceback of the ``foreachBatch`` function (the table sink), a Py4J error wrapping a Java
exception (a source that cannot read, such as Kafka records aged out), the traceback of a
Python worker on an executor (a segment that did not land), and the Java stack traces of
each. :func:`failure_reason` keeps what says what went wrong - the innermost exception's
type and message, and the first line of each ``Caused by:`` below it - and
:func:`query_failed` makes it the :class:`~sparkiq.errors.SparkiqError` that
``App.process_all_available`` raises, with Spark's exception as its ``__cause__``.

Only the text is read (``str(error)``), so classic and Spark Connect exceptions are handled
alike; a text in none of these shapes is kept whole, up to :data:`MAX_REASON` characters.
"""

from __future__ import annotations

import re

from sparkiq.errors import SparkiqError

__all__ = ["MAX_REASON", "failure_reason", "query_failed", "worker_hint"]

#: The longest reason kept, in characters (the rest is cut, marked with "...").
MAX_REASON = 2000

_TRACEBACK = "Traceback (most recent call last):"
# Spark's wrapper around any failure of a query, and PySpark's appendix of the JVM's trace
_STREAM_FAILED = re.compile(r"^\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ")
_JVM_TRACE = "\n\nJVM stacktrace:"
# a Java stack frame ("\tat org.apache...") or an elided run of them ("\t... 12 more")
_JAVA_FRAME = re.compile(r"^\s+(at |\.\.\. \d+ more)")
_CAUSED_BY = re.compile(r"^Caused by: .*$", re.M)
# how Py4J quotes the Java exception under its own error: a line ": <class>: <message>"
_PY4J_JAVA = re.compile(r"^: (?=[\w$.]+: )", re.M)
# Spark's wrapper of a job's failure collected on the driver (``toArrow``): its own message
# says nothing; the reason is the first ``Caused by:`` (with every line of its message)
# that is not another of Spark's wrappers ("Job aborted due to stage failure: ...")
_AWAIT = "Exception thrown in awaitResult"
_CAUSE_START = re.compile(r"^Caused by: (?!org\.apache\.spark\.SparkException: )", re.M)


def failure_reason(error: BaseException | str) -> str:
    """The innermost exception in the text of ``error`` (a failed query's exception, or its
    text), with the ``Caused by:`` lines below it: no tracebacks, no stack frames."""
    text = str(error).split(_JVM_TRACE, 1)[0]
    innermost = _innermost(text)
    if _AWAIT in innermost.partition("\n")[0]:
        cause = _CAUSE_START.search(innermost)
        if cause is not None:
            innermost = innermost[cause.end() :]
    lines: list[str] = []
    for line in innermost.splitlines():
        if _JAVA_FRAME.match(line):
            break
        lines.append(line.rstrip())
    causes: list[str] = []
    for cause in _CAUSED_BY.findall(innermost):
        if cause not in causes and cause not in lines:
            causes.append(cause.rstrip())
    reason = "\n".join([*_trimmed(lines), *causes[:3]])
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3] + "..."


def _innermost(text: str) -> str:
    """The text from the innermost exception on: after the last Python traceback's frames,
    and inside a Py4J error, from the Java exception it quotes."""
    _, found, after = text.rpartition(_TRACEBACK)
    if not found:
        return _STREAM_FAILED.sub("", text.strip(), count=1)
    lines = after.splitlines()
    # a traceback's frames are indented; the exception starts at the first line that is not
    start = next((i for i, line in enumerate(lines) if line and not line[0].isspace()), 0)
    exception = "\n".join(lines[start:])
    if exception.startswith("py4j.protocol.Py4JJavaError"):
        quoted = _PY4J_JAVA.search(exception)
        if quoted is not None:
            return exception[quoted.end() :]
    return exception


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1]:
        lines.pop()
    return lines


def worker_hint(error: BaseException | str) -> str | None:
    """What to do when ``error`` says Spark's Python worker could not run the table's sink:
    it did not connect back in Spark's fixed 10 s (a busy machine, a slow ``python``), or
    the Python it runs has no sparkiq (a Spark Connect server's own Python). None for any
    other failure."""
    text = str(error)
    if "No module named 'sparkiq'" in text:
        return (
            "The Python that runs Spark's workers has no sparkiq: with Spark Connect that is "
            "the server's Python, not yours. Install sparkiq there, or point PYSPARK_PYTHON "
            "(or spark.pyspark.python) in the server's environment at a Python that has it, "
            "such as $(which sparkiq-worker-python) (docs/guide.md, Spark Connect)."
        )
    if "failed to connect back" in text:
        return (
            "Spark's Python worker did not connect back within Spark's fixed 10 s (a busy "
            "machine, or a slow python start). Start workers with sparkiq-worker-python, "
            "which connects back first: PYSPARK_PYTHON=$(which sparkiq-worker-python) in the "
            "Spark (Connect server's) environment, or spark.pyspark.python "
            "(docs/guide.md, Spark Connect)."
        )
    return None


def query_failed(table: str, error: BaseException, committed: int) -> SparkiqError:
    """The error ``App.process_all_available`` raises when ``table``'s query failed with
    ``error``: the reason, where the table stays (its newest commit, ``committed``) and,
    when Spark's Python worker is the cause, what to do (:func:`worker_hint`)."""
    stays = f"at batch {committed}" if committed >= 0 else "empty (no batch committed)"
    hint = worker_hint(error)
    return SparkiqError(
        f"the Spark query of {table!r} failed: {failure_reason(error)}\n"
        + (f"{hint}\n" if hint else "")
        + f"The table stays {stays} and its replicas keep serving it. Once the cause is "
        "dealt with, start the App again: the query resumes from its checkpoint with the "
        "failed batch.",
        store=table,
    )
