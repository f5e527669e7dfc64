"""Lay out the tables gates report as data (`shared.models.Table`): one header line, one line per
row, cells separated by ` | `, columns of text left-aligned and columns of numbers right-aligned
to the widest cell. Numbers: `-` for a missing value, `NaN`/`inf`, integers as they are, other
floats to four significant digits; a column's unit (e.g. `×`, `%`) follows each of its values.
"""

from __future__ import annotations

import math

from shared.models import Cell, Table

__all__ = ["format_cell", "format_table"]


def format_cell(value: Cell, unit: str = "") -> str:
    """One cell as text."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{int(value)}{unit}"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}{unit}"


def format_table(table: Table) -> list[str]:
    """The title, the header and one line per row."""
    units = table.units or ("",) * len(table.columns)
    cells = [
        [format_cell(v, units[i] if i < len(units) else "") for i, v in enumerate(row)]
        for row in table.rows
    ]
    widths = [
        max([len(name), *(len(row[i]) for row in cells if i < len(row))])
        for i, name in enumerate(table.columns)
    ]
    text = [
        all(isinstance(row[i], str) for row in table.rows if i < len(row))
        for i in range(len(table.columns))
    ]

    def line(values: list[str]) -> str:
        padded = [
            value.ljust(widths[i]) if text[i] else value.rjust(widths[i])
            for i, value in enumerate(values)
        ]
        return " | ".join(padded).rstrip()

    return [table.title, line(list(table.columns)), *(line(row) for row in cells)]
