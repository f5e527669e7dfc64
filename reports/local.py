"""Write a report into a local folder: `report.txt` and `report.json`."""

from __future__ import annotations

from pathlib import Path

from reports.json_report import render_json
from reports.text import render_text
from shared.models import Report

__all__ = ["write_local"]


def write_local(report: Report, out: Path) -> tuple[Path, Path]:
    """Write both renderings into `out` (created when missing); return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    text_path, json_path = out / "report.txt", out / "report.json"
    text_path.write_text(render_text(report), encoding="utf-8")
    json_path.write_text(render_json(report), encoding="utf-8")
    return text_path, json_path
