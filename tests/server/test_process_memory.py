"""The process's memory by part: what the C allocator holds in use and what it keeps freed.

Each case runs in a fresh interpreter, so what the allocator holds is what the case did."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from sparkiq.server.process_memory import process_memory

glibc = pytest.mark.skipif(
    "malloc_in_use" not in process_memory(), reason="the C library has no mallinfo2 (not glibc)"
)

# Four threads (each allocates in an arena of its own) take 20 MB each in 4 KB chunks
# (Python hands objects over 512 bytes to malloc), then free all but every 64th chunk: the
# one kept in each run of 64 stops the allocator from trimming a heap's top, so most of the
# freed memory stays resident, as it does in a node after a burst of requests.
FRAGMENT = textwrap.dedent(
    """
    import json, threading
    from sparkiq.server.process_memory import process_memory

    kept = []
    lock = threading.Lock()

    def burst():
        chunks = [bytes(4000) for _ in range(5000)]
        with lock:
            kept.extend(chunks[::64])
        return chunks

    start = process_memory()
    threads = [threading.Thread(target=burst) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"start": start, "after": process_memory(), "kept": len(kept)}))
    """
)


def run(script: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout)
    return out


@glibc
def test_freed_memory_is_reported_apart_from_memory_in_use() -> None:
    got = run(FRAGMENT)
    start, after = got["start"], got["after"]
    assert isinstance(start, dict) and isinstance(after, dict)
    mb = 2**20
    # 80 MB were allocated and all but 1/64 freed: in use grew by about 1.3 MB, while the
    # allocator kept tens of MB of freed chunks, resident (the RSS says so too)
    assert after["malloc_in_use"] - start["malloc_in_use"] < 4 * mb
    held = after["malloc_free_held"] - start["malloc_free_held"]
    assert held > 30 * mb
    assert after["resident"] - start["resident"] > 0.8 * held


def test_the_parts_are_bytes_and_arrow_is_arrows_pool() -> None:
    got = run(
        "import json\n"
        "import pyarrow as pa\n"
        "from sparkiq.server.process_memory import process_memory\n"
        "first = process_memory()\n"
        "table = pa.table({'x': list(range(100_000))})\n"
        "print(json.dumps({'first': first, 'then': process_memory()}))\n"
    )
    first, then = got["first"], got["then"]
    assert isinstance(first, dict) and isinstance(then, dict)
    assert then["arrow"] - first["arrow"] >= 800_000  # 100,000 int64 values
    assert all(isinstance(v, int) and v >= 0 for v in then.values())
    assert then["resident"] > then["malloc_in_use"] + then["arrow"]
