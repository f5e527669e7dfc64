"""Print the drills' figures as the Markdown table of docs/reliability.md.

.venv/bin/python -m tests.drills.summary drill-results/before drill-results/after
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

_HEAD = (
    "| drill | code | runs | answered | by 2 diagnoses | repeated entries | reports/diagnosis "
    "| failed → ERROR + dead letter | time to answer (s) | notes | command |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)
_NOTES = {
    "reports_quoting_a_time_limit_as_evidence": "time limit frozen as evidence",
    "later_alerts_answered": "later alerts answered",
    "oom_kills": "OOM kills",
    "reports_lost_with_s3": "reports the drill's S3 restart destroyed",
    "entries_pointing_at_no_report": "entries pointing at no report",
    "watchdog_resends": "watchdog re-sends",
    "missed": "kills missed",
    "watchdog_or_callback_resends": "sent again",
    "soft_limits_before_the_body": "soft limits before the body",
    "soft_limits_after_the_body": "after it",
    "worker_main_process_deaths": "worker main-process deaths",
    "load_average": "load average (1, 5, 15 min) at the end",
}


def _notes(data: dict[str, Any]) -> str:
    return "; ".join(
        f"{label}: {', '.join(data[key]) if key == 'load_average' else data[key]}"
        for key, label in _NOTES.items()
        if key in data
    )


def _timing(data: dict[str, Any]) -> str:
    for key in ("kill_to_verdict_s", "up_to_last_verdict_s"):
        if key in data:
            values = [v for v in data[key] if v is not None and v >= 0]
            missing = len(data[key]) - len(values)
            shown = ", ".join(f"{v:g}" for v in values) or "-"
            return shown + (f" ({missing} never)" if missing else "")
    latency = data.get("latency_s") or {}
    return f"p50 {latency['p50']:g}, max {latency['max']:g}" if latency else "-"


def row(path: Path, code: str) -> str:
    data = json.loads(path.read_text())
    if "cases" in data:
        silent = len(data["silent"])
        return (
            f"| {data['drill']} | {code} | 1 | {len(data['cases']) - silent}/{len(data['cases'])} "
            f"| - | - | - | - | - | silent: {silent} | `{data['command']}` |"
        )
    reports = data.get("reports_per_diagnosis")
    return (
        f"| {data['drill']} | {code} | {data['runs']} | {data['answered']}/{data['alerts']} "
        f"| {data['answered_by_two_diagnoses']} | {data['repeated_verdict_entries']} "
        f"| {reports if reports is not None else '-'} "
        f"| {data.get('diagnoses_failed_and_dead_lettered', 0)} | {_timing(data)} "
        f"| {_notes(data)} | `{data['command']}` |"
    )


def main() -> None:
    print(_HEAD)
    names = sorted({p.name for folder in sys.argv[1:] for p in Path(folder).glob("*.json")})
    for name in names:
        for folder in sys.argv[1:]:
            path = Path(folder) / name
            if path.exists():
                print(row(path, Path(folder).name))


if __name__ == "__main__":
    main()
