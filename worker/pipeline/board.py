"""The board: a small read-only web page of recent verdicts (Starlette, server-rendered, no script).

`GET /` lists the newest verdicts of the verdict stream, newest first — job, verdict, confidence,
mechanism, when it was judged and announced, every event id it answers — filterable by cluster and
verdict (`?cluster=...&verdict=...`, plain links), each linking to its reports. The page refreshes
itself (a meta refresh: no script). `GET /report/<key>` serves a stored report (`.html`, `.json`,
`.txt`) from the object store through the board, with a Content-Security-Policy that lets the HTML
report load nothing. `GET /healthz` answers `ok`.

Read-only by construction: every route accepts GET (and HEAD) only, so any other method is refused
with 405; the page holds no form and no button; the board reads the stream with XREVRANGE and the
store with GET, and offers no action on a job.

A verdict announced again (alerts that reached a job within the coalescing window) is shown once,
with every event id of its newest announcement. The mechanism comes from the stored JSON report
(the kill proof's mechanism, else the first FAIL or ERROR gate), read once per report: reports are
written once, so the cache never goes stale.

Only what the pipeline signed is shown as a verdict (`shared.signing`): a stream entry that is
malformed or does not verify is a marked row `REFUSED <entry id>: <reason>` (counted in
`rlhealth_verdicts_refused`, served at `GET /metrics`), never a verdict, and never stops the page;
a JSON report that does not verify gives no mechanism and is not served. A failure of Redis or
the store is logged here and shown as a generic page: no address, no exception text.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlencode

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from reports.html import CSP, HTML_TYPE, escape
from shared.models import VerdictEntry, iso_utc
from shared.signing import KeyRing, UnverifiedError, verify
from shared.streams import RefusedEntryError, read_entry
from shared.supervisor import VERDICTS_REFUSED

if TYPE_CHECKING:
    from worker.pipeline.store import ObjectStore

__all__ = ["Board", "BoardRow", "RefusedRow", "make_board", "mechanism_of", "report_key_of"]

log = logging.getLogger(__name__)

PAGE_CSP: Final = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_SECURITY_HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_KEY: Final = re.compile(r"^reports/(?:[^/\x00\\]+/){3}[^/\x00\\]+\.(html|json|txt)$")
_TYPES: Final = {"html": HTML_TYPE, "json": "application/json", "txt": "text/plain; charset=utf-8"}
_MECHANISM_CHARS: Final = 160
_CACHE_SIZE: Final = 2048
_VERDICTS: Final = ("KILL", "NO-KILL", "ERROR")


@dataclass(frozen=True)
class BoardRow:
    """One verdict as the board shows it."""

    entry: VerdictEntry
    announced_at: datetime | None  # from the stream entry id
    report_key: str | None  # the JSON report's key in the store, None when not in this store
    cluster: str
    mechanism: str


@dataclass(frozen=True)
class RefusedRow:
    """A stream entry that is not a verdict: malformed, or its signature missing or wrong."""

    entry_id: str
    reason: str
    announced_at: datetime | None


def report_key_of(uri: str, store_root: str) -> str | None:
    """The store key of a `report_uri`, or None when the URI is not under this store."""
    if not uri.startswith(store_root):
        return None
    key = uri[len(store_root) :]
    return key if _KEY.match(key) else None


def _cluster(key: str | None) -> str:
    return key.split("/")[1] if key else "unknown"


def _first_gate(gates: Mapping[str, Any], status: str) -> str | None:
    for name, gate in gates.items():
        if isinstance(gate, Mapping) and gate.get("status") == status:
            return f"{name}: {gate.get('summary', '')}"
    return None


def mechanism_of(document: Mapping[str, Any]) -> str:
    """What the report says happened, in a line: the kill proof's mechanism, else the first gate
    that decided the verdict (ERROR first for an ERROR verdict, else FAIL first)."""
    proof = document.get("kill_proof")
    if isinstance(proof, Mapping) and proof.get("mechanism"):
        return str(proof["mechanism"])
    gates = document.get("gates")
    if not isinstance(gates, Mapping):
        return "-"
    order = ("ERROR", "FAIL") if document.get("verdict") == "ERROR" else ("FAIL", "ERROR")
    found = _first_gate(gates, order[0]) or _first_gate(gates, order[1])
    if found is None:
        return "-"
    return found if len(found) <= _MECHANISM_CHARS else found[: _MECHANISM_CHARS - 1] + "…"


def _announced(entry_id: Any) -> datetime | None:
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    millis = text.split("-", 1)[0]
    return datetime.fromtimestamp(int(millis) / 1000, UTC) if millis.isdigit() else None


class Board:
    """Reads the verdict stream and the stored reports; renders the page."""

    def __init__(
        self,
        redis: Any,
        store: ObjectStore,
        stream: str,
        *,
        keys: KeyRing,
        limit: int = 100,
        refresh_s: int = 15,
    ) -> None:
        self.redis = redis
        self.store = store
        self.stream = stream
        self.keys = keys
        self.limit = limit
        self.refresh_s = refresh_s
        self._mechanisms: OrderedDict[str, str] = OrderedDict()

    # --- data -------------------------------------------------------------------------------

    def rows(self) -> list[BoardRow | RefusedRow]:
        """The newest verdicts, newest first, each lead shown once (its newest announcement),
        with a refused row for every entry among them that is not a verdict."""
        items = self.redis.xrevrange(self.stream, count=self.limit * 4)
        rows: list[BoardRow | RefusedRow] = []
        seen: set[str] = set()
        for entry_id, fields in items:
            row = self._row(entry_id, fields)
            if isinstance(row, BoardRow):
                if row.entry.event_id in seen:
                    continue  # an older announcement of a verdict already listed
                seen.add(row.entry.event_id)
            rows.append(row)
            if len(rows) >= self.limit:
                break
        return rows

    def _row(self, entry_id: Any, fields: Any) -> BoardRow | RefusedRow:
        try:
            entry = read_entry(fields, self.keys)
        except RefusedEntryError as exc:
            VERDICTS_REFUSED.labels(reader="board", kind=exc.kind).inc()
            text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            return RefusedRow(text, exc.reason, _announced(entry_id))
        key = report_key_of(entry.report_uri, self.store.uri(""))
        return BoardRow(entry, _announced(entry_id), key, _cluster(key), self.mechanism(key))

    def verified_report(self, key: str) -> tuple[bytes, dict[str, Any]]:
        """The stored JSON report at `key` (its bytes and its document), once its signature
        verifies; raises `KeyError` (missing), `UnverifiedError` or `ValueError` (not a JSON
        object)."""
        body = self.store.get(key)
        document = json.loads(body)
        if not isinstance(document, dict):
            raise ValueError("the report is not a JSON object")
        verify(document, self.keys)
        return body, document

    def mechanism(self, key: str | None) -> str:
        if key is None:
            return "-"
        if key not in self._mechanisms:
            try:
                _body, document = self.verified_report(key)
            except UnverifiedError:
                return "report not verified"  # not cached: the next look tries again
            except Exception:  # a missing or unreadable report says so; the board stays up
                return "report not readable"
            self._mechanisms[key] = mechanism_of(document)
            while len(self._mechanisms) > _CACHE_SIZE:
                self._mechanisms.popitem(last=False)
        return self._mechanisms[key]

    # --- page -------------------------------------------------------------------------------

    def page(
        self, rows: Sequence[BoardRow | RefusedRow], cluster: str | None, verdict: str | None
    ) -> str:
        """The page: the verdicts the filters keep, and every refused entry when none is set."""
        verdicts = [row for row in rows if isinstance(row, BoardRow)]
        clusters = sorted({row.cluster for row in verdicts})
        shown = [row for row in rows if _shown(row, cluster, verdict)]
        refused = sum(isinstance(row, RefusedRow) for row in shown)
        warning = f" · {refused} refused (not signed by the pipeline)" if refused else ""
        body = "".join(
            [
                "<h1>rl-job-health — recent verdicts</h1>",
                _filters(clusters, cluster, verdict),
                _table(shown) if shown else '<p class="empty">No verdict matches.</p>',
                f'<p class="foot">{len(shown) - refused} of {len(verdicts)} recent verdicts'
                f"{warning} · refreshes every {self.refresh_s}s · read-only: no action on any job"
                "</p>",
            ]
        )
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="refresh" content="{self.refresh_s}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>rl-job-health board</title><style>{_STYLE}</style></head>"
            f"<body><main>{body}</main></body></html>\n"
        )


_STYLE: Final = """
body { margin:0; font:14px/1.4 system-ui, sans-serif; color:#1f2933; background:#f5f7fa; }
main { max-width:1280px; margin:0 auto; padding:14px 18px; }
h1 { font-size:20px; margin:4px 0 10px; }
nav { margin:6px 0; } nav a, nav b { margin-right:10px; }
nav b { background:#1f2933; color:#fff; border-radius:5px; padding:1px 7px; }
table { border-collapse:collapse; width:100%; background:#fff; }
th, td { border-bottom:1px solid #d9e2ec; padding:6px 8px; text-align:left; vertical-align:top; }
th { background:#e4e7eb; font-size:13px; }
td.ids { font-family:monospace; font-size:12px; }
.v { font-weight:700; border-radius:5px; padding:1px 7px; color:#fff; white-space:nowrap; }
.v-KILL { background:#b71c1c; } .v-NO-KILL { background:#1b5e20; } .v-ERROR { background:#e65100; }
.v-REFUSED { background:#52606d; } tr.refused td { background:#fff4e5; color:#52606d; }
.empty, .foot { color:#52606d; }
"""


def _shown(row: BoardRow | RefusedRow, cluster: str | None, verdict: str | None) -> bool:
    if isinstance(row, RefusedRow):
        return cluster is None and verdict is None
    return (cluster is None or row.cluster == cluster) and (
        verdict is None or row.entry.verdict.value == verdict
    )


def _link(label: str, params: Mapping[str, str | None], current: bool) -> str:
    if current:
        return f"<b>{escape(label)}</b>"
    query = urlencode({k: v for k, v in params.items() if v})
    return f'<a href="/{"?" + query if query else ""}">{escape(label)}</a>'


def _filters(clusters: Sequence[str], cluster: str | None, verdict: str | None) -> str:
    verdict_links = [_link("all verdicts", {"cluster": cluster}, verdict is None)]
    for name in _VERDICTS:
        verdict_links.append(_link(name, {"cluster": cluster, "verdict": name}, verdict == name))
    cluster_links = [_link("all clusters", {"verdict": verdict}, cluster is None)]
    for name in clusters:
        cluster_links.append(_link(name, {"cluster": name, "verdict": verdict}, cluster == name))
    return f"<nav>{' '.join(verdict_links)}</nav><nav>{' '.join(cluster_links)}</nav>"


def _report_links(key: str | None) -> str:
    if key is None:
        return "-"
    base = key.removesuffix(".json")
    links = [
        f'<a href="/report/{quote(base + suffix, safe="/:@")}">{label}</a>'
        for suffix, label in ((".html", "report"), (".txt", "text"), (".json", "json"))
    ]
    return " · ".join(links)


def _refused_row(row: RefusedRow) -> str:
    return (
        '<tr class="refused">'
        f'<td colspan="4"><span class="v v-REFUSED">REFUSED</span> '
        f"{escape(row.entry_id)}: {escape(row.reason)}</td>"
        f"<td>-<br><small>announced {escape(iso_utc(row.announced_at) or '-')}</small></td>"
        "<td>-</td><td>not a verdict</td>"
        "</tr>"
    )


def _row(row: BoardRow | RefusedRow) -> str:
    if isinstance(row, RefusedRow):
        return _refused_row(row)
    entry = row.entry
    verdict = entry.verdict.value
    return (
        "<tr>"
        f"<td>{escape(entry.job_id)}<br><small>{escape(row.cluster)}</small></td>"
        f'<td><span class="v v-{escape(verdict)}">{escape(verdict)}</span></td>'
        f"<td>{escape(entry.confidence.value)}</td>"
        f"<td>{escape(row.mechanism)}</td>"
        f"<td>{escape(iso_utc(entry.captured_at))}<br><small>announced "
        f"{escape(iso_utc(row.announced_at) or '-')}</small></td>"
        f'<td class="ids">{"<br>".join(escape(i) for i in entry.event_ids)}</td>'
        f"<td>{_report_links(row.report_key)}</td>"
        "</tr>"
    )


def _table(rows: Sequence[BoardRow | RefusedRow]) -> str:
    head = "".join(
        f"<th>{name}</th>"
        for name in ("job", "verdict", "confidence", "mechanism", "judged as of", "event ids", "")
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(map(_row, rows))}</tbody></table>"


# --- the application ------------------------------------------------------------------------------


def _html(body: str, status: int = 200, csp: str = PAGE_CSP) -> HTMLResponse:
    headers = {**_SECURITY_HEADERS, "Content-Security-Policy": csp}
    return HTMLResponse(body, status_code=status, headers=headers)


def _problem(status: int, message: str) -> HTMLResponse:
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>rl-job-health board'
        f'</title></head><body><p>{escape(message)}</p><p><a href="/">back to the board</a></p>'
        "</body></html>\n"
    )
    return _html(page, status)


def _choice(request: Request, name: str, allowed: Sequence[str] | None = None) -> str | None:
    value = request.query_params.get(name) or None
    if value is not None and allowed is not None and value not in allowed:
        return None
    return value


async def _report(board: Board, key: str) -> Response:
    """A stored report through the board; the JSON one only when its signature verifies."""
    match = _KEY.match(key)
    if match is None or any(part in {".", ".."} for part in key.split("/")):
        return _problem(404, "not a report key")
    kind = match.group(1)
    try:
        if kind == "json":  # the signed one: served only when it verifies
            body, _document = await run_in_threadpool(board.verified_report, key)
        else:
            body = await run_in_threadpool(board.store.get, key)
    except KeyError:
        return _problem(404, f"no stored report at {key} (stored before HTML reports existed?)")
    except (UnverifiedError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, UnverifiedError) else "not a JSON object"
        return _problem(409, f"the stored report at {key} is refused: {reason}")
    except Exception:  # the store away: say so, keep serving; the details stay in the log
        log.exception("the board could not read the report store")
        return _problem(503, "the report store is unavailable; the board's log says why")
    headers = {**_SECURITY_HEADERS, "Content-Security-Policy": CSP}
    return Response(body, media_type=_TYPES[kind], headers=headers)


def make_board(board: Board) -> Starlette:
    """The ASGI application: GET (and HEAD) only."""

    async def index(request: Request) -> Response:
        try:
            rows = await run_in_threadpool(board.rows)  # blocking Redis and S3 reads
        except Exception:  # Redis away: say so, keep serving; the details (an address) stay here
            log.exception("the board could not read the verdict stream")
            return _problem(503, "the verdict stream is unavailable; the board's log says why")
        cluster, verdict = _choice(request, "cluster"), _choice(request, "verdict", _VERDICTS)
        return _html(board.page(rows, cluster, verdict))

    async def report(request: Request) -> Response:
        return await _report(board, str(request.path_params["key"]))

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok", headers=_SECURITY_HEADERS)

    async def metrics(request: Request) -> Response:
        headers = {**_SECURITY_HEADERS, "Content-Type": CONTENT_TYPE_LATEST}
        return Response(generate_latest(), headers=headers)

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/report/{key:path}", report, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes)
