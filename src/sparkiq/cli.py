"""The ``sparkiq`` command line.

Every option can also be set by the ``SPARKIQ_*`` environment variable shown in ``--help``;
a flag given on the command line wins over the variable.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _env(name: str, default: Any) -> Any:
    return os.environ.get(f"SPARKIQ_{name}", default)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkiq",
        description="Interactive queries over the live state of PySpark streaming pipelines.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run a self-contained streaming pipeline and query its tables live",
        description="Runs a shop pipeline on a built-in event generator, materializes three "
        "tables and prints live query results as they change. Stop with Ctrl-C.",
    )
    demo.add_argument(
        "--state-dir",
        default=_env("STATE_DIR", "./demo-state"),
        help="where the changelog and replicas live [SPARKIQ_STATE_DIR, default ./demo-state]",
    )
    demo.add_argument(
        "--duration",
        type=float,
        default=float(_env("DEMO_DURATION", 0)),
        help="stop after this many seconds; 0 runs until Ctrl-C [SPARKIQ_DEMO_DURATION]",
    )
    demo.add_argument(
        "--rate",
        type=int,
        default=int(_env("DEMO_RATE", 200)),
        help="generated events per second [SPARKIQ_DEMO_RATE, default 200]",
    )
    demo.add_argument(
        "--partitions",
        type=int,
        default=int(_env("DEMO_PARTITIONS", 4)),
        help="partitions per table [SPARKIQ_DEMO_PARTITIONS, default 4]",
    )
    demo.add_argument(
        "--fresh",
        action="store_true",
        help="delete --state-dir first instead of resuming from it",
    )

    status = commands.add_parser(
        "status",
        help="show the tables in a state_dir and their committed progress",
    )
    status.add_argument(
        "--state-dir",
        default=_env("STATE_DIR", "./demo-state"),
        help="the state_dir to inspect [SPARKIQ_STATE_DIR]",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from sparkiq.demo import run_demo

        return run_demo(
            state_dir=args.state_dir,
            duration=args.duration,
            rate=args.rate,
            partitions=args.partitions,
            fresh=args.fresh,
        )
    if args.command == "status":
        return _status(args.state_dir)
    return 2


def _status(state_dir: str) -> int:
    from sparkiq.changelog import Changelog, list_tables

    tables = list_tables(state_dir)
    if not tables:
        print(f"no sparkiq tables in {state_dir!r}", file=sys.stderr)
        return 1
    print(f"{'table':<28} {'partitions':>10} {'key':<24} {'batches':>8} {'last batch':>10}")
    for name in tables:
        changelog = Changelog(state_dir, name)
        manifest = changelog.manifest()
        batches = changelog.committed_batch_ids()
        last = batches[-1] if batches else "-"
        key = ",".join(manifest.key_columns) + (
            f" [{manifest.window_column}]" if manifest.window_column else ""
        )
        print(f"{name:<28} {manifest.partitions:>10} {key:<24} {len(batches):>8} {last!s:>10}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
