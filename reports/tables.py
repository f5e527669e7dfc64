"""Lay out the tables gates report as data (`shared.models.Table`): one header line, one line per
row, cells separated by ` | `, columns of text left-aligned and columns of numbers right-aligned
to the widest cell. Numbers: `-` for a missing value, `NaN`/`inf`, integers as they are, other
floats to four significant digits; a column's unit (e.g. `×`, `%`) follows each of its values.

A table wider than `width` is laid out in blocks of columns, each under its own header and each
repeating the first column (the row's key: a step, an engine, a phase), so no line is wider than
`width` unless one column alone is.
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


def format_table(table: Table, width: int | None = None) -> list[str]:
    """The title, the header and one line per row; in blocks of columns when wider than
    `width` (module docstring)."""
    units = table.units or ("",) * len(table.columns)
    cells = [
        [format_cell(v, units[i] if i < len(units) else "") for i, v in enumerate(row)]
        for row in table.rows
    ]
    widths = [
        max([len(name), *(len(row[i]) for row in cells if i < len(row))])
        for i, name in enumerate(table.columns)
    ]
    # the first column is the row's key, always left-aligned: a row's line then begins with
    # its key, never with spaces (`reports.text.logical_lines` tells continuations by them)
    text = [
        i == 0 or all(isinstance(row[i], str) for row in table.rows if i < len(row))
        for i in range(len(table.columns))
    ]

    def line(values: list[str], columns: list[int]) -> str:
        padded = [
            values[i].ljust(widths[i]) if text[i] else values[i].rjust(widths[i])
            for i in columns
            if i < len(values)
        ]
        return " | ".join(padded).rstrip()

    lines = [table.title]
    for block in _blocks(widths, width):
        lines.append(line(list(table.columns), block))
        lines.extend(line(row, block) for row in cells)
    return lines


def _blocks(widths: list[int], width: int | None) -> list[list[int]]:
    """Column indexes in blocks that fit `width` (` | ` between cells), each block after the
    first starting with column 0; one block when everything fits or no width is set."""
    if not widths:
        return [[]]
    every = list(range(len(widths)))
    if width is None or sum(widths) + 3 * (len(widths) - 1) <= width:
        return [every]
    blocks: list[list[int]] = []
    block, used = [0], widths[0]
    for i in every[1:]:
        if len(block) > 1 and used + 3 + widths[i] > width:
            blocks.append(block)
            block, used = [0], widths[0]
        block.append(i)
        used += 3 + widths[i]
    blocks.append(block)
    return blocks
