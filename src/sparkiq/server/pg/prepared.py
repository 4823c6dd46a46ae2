"""A prepared statement of the extended protocol and its portals: what a ``Parse`` learns
once, and each ``Bind``/``Describe``/``Execute`` of the statement reuses.

A driver runs a prepared statement as ``Bind``, ``Describe`` (of the portal), ``Execute``,
``Sync`` (psycopg, libpq's ``PQsendQueryPrepared``). What depends on the statement alone is
worked out at ``Parse``: where its ``$n`` are (:func:`~sparkiq.server.pg.parameters.
parameter_slots`), whether it is blank, and whether it is a pull query (answered by
:meth:`~sparkiq.server.pg.answers.Answers.pull`, not classified again per run). Per result
format codes, the ``RowDescription`` bytes and the value encoders of the columns it answers
with are kept for as long as its answers come with the same columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pygwire import messages as m

from sparkiq.server.pg.answers import Answer, Answers
from sparkiq.server.pg.parameters import Slots, parameter_slots
from sparkiq.server.pg.statements import is_blank
from sparkiq.server.pg.types import PgColumn
from sparkiq.server.pg.wire import row_description

__all__ = ["Encoder", "Portal", "Statement", "fields", "format_of"]

Encoder = Callable[[Any], bytes]
_FORMATS_KEPT = 4  # result format lists kept per statement (a client uses one or two)


@dataclass
class Statement:
    """A prepared statement (see the module docstring)."""

    text: str
    param_oids: list[int]
    slots: Slots
    blank: bool
    pull: bool
    columns: list[PgColumn] | None = None  # as described to the client, once asked
    # the last answer's columns found to have the described columns' names
    _matched: list[PgColumn] | None = None
    # by result formats: the columns they were made for, RowDescription, encoders
    _encoded: dict[tuple[int, ...], tuple[list[PgColumn], bytes, list[Encoder]]] = field(
        default_factory=dict
    )

    @classmethod
    def parse(cls, text: str, param_oids: list[int], answers: Answers) -> Statement:
        blank = is_blank(text)
        pull = not blank and answers.is_pull(text)
        return cls(text, param_oids, parameter_slots(text), blank, pull)

    def columns_of(self, answered: list[PgColumn] | None) -> list[PgColumn] | None:
        """The columns to send an answer of this statement with: those it was described
        with when the answer's have the same names (clients decode by the described
        types), else the answer's own."""
        described = self.columns
        if answered is None or described is None:
            return answered
        if answered is self._matched:
            return described
        if [c.name for c in described] == [c.name for c in answered]:
            self._matched = answered
            return described
        return answered

    def encoding(
        self, columns: list[PgColumn], formats: Sequence[int]
    ) -> tuple[bytes, list[Encoder]]:
        """The ``RowDescription`` of ``columns`` in ``formats`` (result format codes) and
        the encoder of each column's values."""
        key = tuple(formats)
        held = self._encoded.get(key)
        if held is not None and held[0] is columns:
            return held[1], held[2]
        description = row_description(fields(columns, formats))
        encoders = [c.encoder(format_of(formats, i) == 1) for i, c in enumerate(columns)]
        if len(self._encoded) >= _FORMATS_KEPT:
            self._encoded.clear()
        self._encoded[key] = (columns, description, encoders)
        return description, encoders


@dataclass
class Portal:
    """A bound statement: its text with the parameters as literals, the result formats
    asked for, and once run its answer, the columns it is sent with and how many rows
    were sent."""

    statement: Statement
    text: str
    result_formats: list[int]
    answer: Answer | None = None
    columns: list[PgColumn] | None = None
    sent: int = 0
    encoders: list[Encoder] = field(default_factory=list)


def format_of(formats: Sequence[int], index: int) -> int:
    """Column ``index``'s format code: none given is text, one is every column's."""
    if not formats:
        return 0
    return formats[0] if len(formats) == 1 else formats[index]


def fields(columns: Sequence[PgColumn], formats: Sequence[int]) -> list[m.FieldDescription]:
    """The ``RowDescription`` fields of ``columns`` sent in ``formats``."""
    return [
        m.FieldDescription(
            name=c.name,
            type_oid=c.type.oid,
            type_size=c.type.size,
            type_modifier=-1,
            format_code=format_of(formats, i),
        )
        for i, c in enumerate(columns)
    ]
