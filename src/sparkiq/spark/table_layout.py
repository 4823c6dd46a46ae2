"""What ``App.materialize`` checks before anything runs: a table's layout (its manifest) from
the DataFrame and options, and that it agrees with a table of that name already in
``state_dir``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sparkiq.changelog import Changelog, TableManifest, check_table_name
from sparkiq.changelog.manifest import OUTPUT_MODES
from sparkiq.errors import ConfigError, LayoutMismatchError, SchemaError
from sparkiq.schema.codec import RowCodec
from sparkiq.schema.types import TableSchema
from sparkiq.stores.history import History

__all__ = ["MAX_TABLE_PARTITIONS", "check_layout", "table_manifest"]

#: The most partitions a table may have.
MAX_TABLE_PARTITIONS = 4096


def table_manifest(
    name: str,
    df: Any,
    key: str | Sequence[str],
    partitions: int,
    window: str | None,
    tombstone: str | None,
    output_mode: str,
    history: dt.timedelta | int | None,
) -> TableManifest:
    """The manifest of table ``name`` materialized from streaming DataFrame ``df`` (the
    arguments are ``App.materialize``'s); :class:`ConfigError` / :class:`SchemaError` name
    what is wrong."""
    try:
        check_table_name(name)
    except ValueError as exc:
        raise ConfigError(str(exc), store=str(name)) from None
    if not hasattr(df, "isStreaming") or not hasattr(df, "schema"):
        raise ConfigError(f"materialize() needs a DataFrame, got {type(df).__name__}", store=name)
    if not df.isStreaming:
        raise ConfigError(
            f"DataFrame for {name!r} is not streaming: build it from spark.readStream",
            store=name,
        )
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"partitions must be a positive int, got {partitions!r}", store=name)
    if partitions > MAX_TABLE_PARTITIONS:
        raise ConfigError(
            f"partitions={partitions} exceeds the maximum of {MAX_TABLE_PARTITIONS}", store=name
        )
    key_columns = (key,) if isinstance(key, str) else tuple(key)
    if not key_columns or not all(isinstance(k, str) and k for k in key_columns):
        raise ConfigError(
            f"key must be a column name or a non-empty list of names, got {key!r}", store=name
        )
    if len(set(key_columns)) != len(key_columns):
        raise ConfigError(f"key lists a column twice: {list(key_columns)}", store=name)
    if output_mode not in OUTPUT_MODES:
        raise ConfigError(
            f"output_mode must be one of {list(OUTPUT_MODES)}, got {output_mode!r}",
            store=name,
        )
    try:
        schema = TableSchema.from_spark_json(df.schema.json(), key_columns, window)
    except SchemaError as exc:
        raise SchemaError(f"cannot materialize {name!r}: {exc.message}", store=name) from None
    stored = schema
    if tombstone is not None:
        if tombstone not in schema.column_names:
            raise SchemaError(
                f"tombstone column {tombstone!r} is not a column of {name!r}; columns are "
                f"{list(schema.column_names)}",
                store=name,
            )
        if schema.field(tombstone).type.name != "boolean":
            raise SchemaError(f"tombstone column {tombstone!r} must be boolean", store=name)
        if tombstone in key_columns:
            raise SchemaError(f"tombstone column {tombstone!r} cannot be a key column")
        stored = TableSchema(
            tuple(f for f in schema.fields if f.name != tombstone), key_columns, window
        )
    try:
        RowCodec(stored)  # refuses column types the changelog cannot store
    except SchemaError as exc:
        raise SchemaError(f"cannot materialize {name!r}: {exc.message}", store=name) from None
    manifest = TableManifest(
        name=name,
        schema=stored,
        partitions=partitions,
        output_mode=output_mode,
        tombstone_column=tombstone,
        history=History.from_option(name, history),
    )
    return manifest


def check_layout(changelog: Changelog, manifest: TableManifest) -> None:
    """Refuse (:class:`LayoutMismatchError`) a manifest that differs from the one of the
    table already in ``changelog``, if any."""
    if not changelog.exists():
        return
    diffs = changelog.manifest().differences(manifest)
    if diffs:
        raise LayoutMismatchError(
            f"table {manifest.name!r} in {changelog.state_dir!r} was created with another "
            "layout: "
            + "; ".join(diffs)
            + " (requested != existing). Materialize under a new name, or delete "
            f"{changelog.root!r} to start the table over.",
            store=manifest.name,
        )
