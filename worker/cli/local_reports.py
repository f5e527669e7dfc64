"""Write a report into a local folder: `report.txt` and `report.json`.

The folder must be this process's own (`shared.safefs.owned_directory`, made when missing), and
each file is written whole under a new name, then renamed over its own: a symlink planted in the
folder is replaced, never written through.
"""

from __future__ import annotations

from pathlib import Path

from reports.json_report import render_json
from reports.text import render_text
from shared.models import Report
from shared.safefs import OUTPUT_MODE, owned_directory, write_file

__all__ = ["write_local"]


def write_local(report: Report, out: Path) -> tuple[Path, Path]:
    """Write both renderings into `out` (made when missing); return their paths.
    `shared.safefs.UnsafeDirectoryError` when `out` is not this process's own."""
    owned_directory(out, mode=OUTPUT_MODE)
    text_path = write_file(out, "report.txt", render_text(report).encode())
    json_path = write_file(out, "report.json", render_json(report).encode())
    return text_path, json_path
