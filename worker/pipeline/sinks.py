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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reports.html import HTML_TYPE, html_key, render_html
from reports.json_report import render_json
from reports.text import render_text
from shared.models import Report, VerdictEntry
from shared.redact import clean, cut_bytes
from shared.signing import KeyRing, sign
from shared.streams import StreamNames
from worker.evidence.case import Evidence
from worker.pipeline.failures import EvidenceLostError, ReportLostError, describe, must_propagate
from worker.pipeline.metrics import html_drawn
from worker.pipeline.report_keys import report_key
from worker.pipeline.store import ObjectStore, key_segment

if TYPE_CHECKING:
    from worker.pipeline.coalesce import Coalescer

__all__ = [
    "ReportShelf",
    "S3ReportSink",
    "StoredReport",
    "VerdictStreamSink",
    "report_stored",
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
    task after the verdict is published (`ReportShelf.html`).
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _place(evidence: Evidence) -> dict[str, str]:
    """Where a report of this evidence goes: cluster, user and job as safe key segments."""
    bundle = evidence.bundle
    job = bundle.job_name or Path(evidence.job_id).name
    return {
        "cluster": key_segment(bundle.cluster, "unknown-cluster"),
        "user": key_segment(bundle.user, "unknown-user"),
        "job": key_segment(job, "unknown-job"),
    }


def report_stored(store: ObjectStore, report_uri: str) -> bool:
    """Whether the report at `report_uri` is in `store` (one outside this store is not)."""
    key = _key_of(store, report_uri)
    return key is not None and store.exists(key)


def _key_of(store: ObjectStore, report_uri: str) -> str | None:
    """The key of a report URI in `store`; None for a URI of another store."""
    base = store.uri("")
    return report_uri[len(base) :] if report_uri.startswith(base) else None


class ReportShelf:
    """The reports of one store: written once to S3, kept in Redis (by URI) until the HTML page
    is drawn after publish, confirmed in S3 before their entry is announced."""

    def __init__(
        self,
        store: ObjectStore,
        redis: Any,
        names: StreamNames,
        keys: KeyRing,
        *,
        retention_s: int,
        thaw: Callable[[str], Evidence],
    ) -> None:
        self.store = store
        self.redis = redis
        self.names = names
        self.keys = keys
        self.retention_s = retention_s
        self.thaw = thaw  # the frozen evidence of an id, for the page's plots

    def put(self, report: Report, evidence: Evidence) -> StoredReport:
        """The text and JSON renderings, written once under the report's key; the report itself
        is kept in Redis (by its URI) for the HTML page drawn after publish (`html`)."""
        stored = S3ReportSink(self.store, self.keys)(report, **_place(evidence))
        key, fields = self._kept(stored.uri), {"json_key": stored.json_key}
        with self.redis.pipeline() as batch:
            batch.hset(key, mapping={**fields, "report": report.model_dump_json()})
            batch.expire(key, self.retention_s)
            batch.execute()
        return stored

    def _kept(self, report_uri: str) -> str:
        return f"{self.names.prefix}:report:{report_uri}"

    def confirm(self, entry: VerdictEntry) -> None:
        """The report `entry` points at is in S3 before the entry is announced. A report S3
        lost after it was written (an S3 restarted empty between the verdict and its publish,
        or before a decided verdict is published again by a re-run or the error callback) is
        written again from the copy Redis keeps for the HTML page; when that is gone too, the
        decision is withdrawn and `ReportLostError` raised (the diagnosis is sent again)."""
        if report_stored(self.store, entry.report_uri):
            return
        stored = self.redis.hgetall(self._kept(entry.report_uri))
        kept = {_text(k): v for k, v in stored.items()}
        json_key = _text(kept.get("json_key", ""))
        if "report" in kept and json_key.endswith(".json"):
            report = Report.model_validate_json(kept["report"])
            S3ReportSink(self.store, self.keys).write(report, json_key.removesuffix(".json"))
            log.warning("report %s was gone from S3: written again", entry.report_uri)
            return
        self.redis.delete(self.names.entry(entry.event_id))
        raise ReportLostError(
            f"the report of {entry.event_id} is gone from S3 ({entry.report_uri}) and not kept"
        )

    def html(self, entry: dict[str, Any], evidence_id: str | None) -> str | None:
        """Draw the HTML page of a published verdict beside its JSON report (same key, `.html`),
        its plots from the frozen evidence `evidence_id`; returns the page's key, None when the
        report is no longer kept. Best effort: evidence that cannot be read, or plots that
        cannot be drawn, give the page without plots (logged, counted); faults of Redis or S3
        raise, to be retried."""
        uri = VerdictEntry.model_validate(entry).report_uri
        kept = {_text(k): v for k, v in self.redis.hgetall(self._kept(uri)).items()}
        if "json_key" not in kept or "report" not in kept:
            json_key = _key_of(self.store, uri)  # drawn by an earlier run?
            if json_key is not None and self.store.exists(html_key(json_key)):
                return html_key(json_key)
            log.warning("the report %s is no longer kept: its HTML page is not drawn", uri)
            html_drawn("report_gone")
            return None
        json_key = _text(kept["json_key"])
        if not self.store.exists(html_key(json_key)):  # else drawn by an earlier run
            report = Report.model_validate_json(kept["report"])
            evidence = self._plotted(evidence_id) if evidence_id else None
            failed: list[BaseException] = []
            store_html(self.store, json_key, report, evidence, failed=failed.append)
            html_drawn("without_plots" if failed or evidence is None else "drawn")
        self.redis.delete(self._kept(uri))
        return html_key(json_key)

    def _plotted(self, evidence_id: str) -> Evidence | None:
        """The frozen evidence to draw plots from; None when it is gone or cannot be read."""
        try:
            return self.thaw(evidence_id)
        except Exception as exc:
            if not isinstance(exc, EvidenceLostError) and must_propagate(exc):
                raise
            log.warning("HTML page of %s drawn without plots: %s", evidence_id, describe(exc))
            return None
