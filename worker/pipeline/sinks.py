"""Where a finished report goes: S3 (write-once; the JSON, text and HTML reports) and the verdict
stream. The renderings themselves are `reports/`'s; this module only stores and announces them.

The order is the contract's: the report is in S3 before its verdict entry is announced, so every
`report_uri` a supervisor reads can be fetched. Both renderings are bounded and redacted
(`reports.bounds`); the verdict entry's job id is cleaned, and S3 key segments made from bundle
values keep only `[A-Za-z0-9._-]`. The JSON report in S3 and the verdict entry are signed
(`shared.signing`): the JSON report carries `key_id` and `signature` after its fields.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reports.html import HTML_TYPE, html_key, render_html
from reports.json_report import render_json
from reports.text import render_text
from shared.models import Report, VerdictEntry
from shared.redact import clean, cut_bytes
from shared.signing import KeyRing, sign
from worker.pipeline.report_keys import report_key

if TYPE_CHECKING:
    from worker.evidence.case import Evidence
    from worker.pipeline.coalesce import Coalescer
    from worker.pipeline.store import ObjectStore

__all__ = [
    "S3ReportSink",
    "StoredReport",
    "VerdictStreamSink",
    "signed_json",
    "store_html",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredReport:
    text_key: str
    json_key: str
    uri: str  # s3:// URI of the JSON report


def signed_json(report: Report, ring: KeyRing) -> str:
    """The JSON report (`render_json`) with `key_id` and `signature` after its fields."""
    document = sign(json.loads(render_json(report)), ring)
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


class S3ReportSink:
    """Writes both renderings once under `reports/...`, the JSON one signed by `ring`; writing
    the same key again is a no-op."""

    def __init__(self, store: ObjectStore, ring: KeyRing) -> None:
        self.store = store
        self.ring = ring

    def __call__(
        self, report: Report, *, cluster: str | None, user: str | None, job: str | None
    ) -> StoredReport:
        return self.write(report, report_key(report, cluster, user, job))

    def write(self, report: Report, base: str) -> StoredReport:
        """Both renderings under `base` (the key without its extension), the JSON one last."""
        text_key, json_key = f"{base}.txt", f"{base}.json"
        self.store.put_once(text_key, render_text(report).encode(), "text/plain; charset=utf-8")
        self.store.put_once(json_key, signed_json(report, self.ring).encode(), "application/json")
        return StoredReport(text_key, json_key, self.store.uri(json_key))


class VerdictStreamSink:
    """XADDs the verdict entry to `<prefix>:verdicts` and PUBLISHes it on the channel, once."""

    def __init__(self, coalescer: Coalescer) -> None:
        self.coalescer = coalescer

    @staticmethod
    def entry(report: Report, stored: StoredReport) -> VerdictEntry:
        """The verdict entry of a report already stored in S3."""
        lead = report.event_id or ""
        return VerdictEntry(
            event_id=lead,
            event_ids=report.event_ids or (lead,),
            job_id=cut_bytes(clean(report.job_id), 512),  # it comes from the bundle: data
            verdict=report.verdict,
            confidence=report.confidence,
            report_uri=stored.uri,
            captured_at=report.captured_at,
        )

    def __call__(self, entry: VerdictEntry, *, job: str) -> VerdictEntry:
        """Publish once, signed; returns the entry as published (by this call or an earlier
        one), or, taken over by a newer lead, signed with every event id answered so far."""
        self.coalescer.publish(entry, job)
        published = self.coalescer.published(entry.event_id)
        if published is not None:
            return published
        answers = tuple(self.coalescer.answers(entry.event_id)) or entry.event_ids
        return entry.model_copy(update={"event_ids": answers}).signed(self.coalescer.keys)


def store_html(
    store: ObjectStore,
    json_key: str,
    report: Report,
    evidence: Evidence | None,
    *,
    failed: Callable[[BaseException], None] | None = None,
) -> str:
    """Store the HTML report once beside the JSON report (same key, `.html`); returns its key.

    Rendering is best effort: the text and JSON reports are the contract, so a page that cannot
    be drawn is stored without its plots (saying why; `failed` is told the exception). Faults of
    the store itself propagate, to be retried like any other. The pipeline calls this in its own
    task after the verdict is published (`worker.pipeline.steps.Pipeline.html`).
    """
    key = html_key(json_key)
    if store.exists(key):  # written on an earlier run of this step: no need to draw again
        return key
    try:
        page = render_html(report, evidence)
    except Exception as exc:
        log.exception("the HTML report of %s could not be drawn; storing it without plots", key)
        if failed is not None:
            failed(exc)
        page = render_html(report)
    store.put_once(key, page.encode("utf-8"), HTML_TYPE)
    return key
