"""Where a report lives in the object store:
`reports/<cluster>/<user>/<job>/<captured_at>-<event_id>` (the JSON, text and HTML beside it).

The key is built from bundle values (data), so each segment keeps only `[A-Za-z0-9._-]`. The
sinks write under it; the coalescer reads the cluster back from a published `report_uri`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from shared.models import Report, iso_utc

__all__ = ["cluster_of", "report_key"]

_UNSAFE_KEY: Final = re.compile(r"[^A-Za-z0-9._-]+")


def _segment(value: str | None, fallback: str) -> str:
    """One key segment from a bundle value: only `[A-Za-z0-9._-]`, never `.` or `..` alone."""
    text = _UNSAFE_KEY.sub("_", (value or "").strip("/"))[:128].lstrip(".")
    return text or fallback


def report_key(report: Report, cluster: str | None, user: str | None, job: str | None) -> str:
    """`reports/<cluster>/<user>/<job>/<captured_at>-<event_id>` (without the extension)."""
    job_name = job or Path(report.job_id).name
    stamp = iso_utc(report.captured_at)
    return (
        f"reports/{_segment(cluster, 'unknown-cluster')}/{_segment(user, 'unknown-user')}/"
        f"{_segment(job_name, 'unknown-job')}/{stamp}-{report.event_id or 'no-event'}"
    )


def cluster_of(report_uri: str) -> str | None:
    """The cluster segment of a report's URI (`.../reports/<cluster>/<user>/<job>/<file>`), as
    `report_key` wrote it; None for a URI of another shape."""
    parts = report_uri.split("/")
    return parts[-4] if len(parts) >= 5 and parts[-5] == "reports" else None
