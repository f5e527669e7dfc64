"""The JSON report of docs/interface.md#the-report, rendered from the bounded report
(`reports.bounds`): every string redacted and escaped, every list capped with a `… and N more`
entry, under MAX_REPORT_BYTES."""

from __future__ import annotations

import json

from reports.bounds import bounded_rendering
from shared.models import Report

__all__ = ["render_json"]


@bounded_rendering
def render_json(report: Report) -> str:
    """The report as indented JSON, keys in contract order, ending with a newline."""
    return json.dumps(report.contract_dict(), indent=2, ensure_ascii=False) + "\n"
