"""The JSON report of CONTRACT.md."""

from __future__ import annotations

import json

from shared.models import Report

__all__ = ["render_json"]


def render_json(report: Report) -> str:
    """The report as indented JSON, keys in contract order, ending with a newline."""
    return json.dumps(report.contract_dict(), indent=2, ensure_ascii=False) + "\n"
