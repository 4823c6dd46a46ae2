"""``python -m tests.faults.faulty_serve CONTROL SEED serve ...``: ``sparkiq serve`` whose
changelog storage is a :class:`~tests.faults.faultfs.FaultyFileSystem` driven by the JSON
file CONTROL (the rest of the arguments are ``sparkiq``'s own)."""

from __future__ import annotations

import sys

from sparkiq.cli import main
from tests.faults.faultfs import install


def run(argv: list[str]) -> int:
    control, seed, args = argv[0], int(argv[1]), argv[2:]
    install(args[args.index("--state-dir") + 1], control, seed)
    return main(args)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
