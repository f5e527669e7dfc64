"""The HTML report: one self-contained file for people who would rather look than read.

Inline CSS, the plots of `reports.plots` as PNG data URIs, no script, no link to anything outside
the file; a Content-Security-Policy meta tag forbids the browser to fetch anything but the inline
images, so even a quote that slipped through as markup could not reach the network. Every piece
of text from the evidence (quotes, summaries, job ids, paths) is HTML-escaped here, and control and
bidirectional-override characters are shown as `\\xNN` / `\\uNNNN`, so no quoted text can add markup
or disguise a line. (Redaction of credentials happens when a Quote is made, before rendering.)

Layout: the verdict, confidence, mode and kill proof at a glance (with the second look before a
stall KILL, when one was taken); a strip of gate statuses; the
reasoning, next action, flip signal and handoff; each gate with its status, summary, quoted
evidence and detail table; the plots; the discrepancies.

The plots (`reports.plots`, matplotlib) are imported with this module, not on the first page drawn:
the pipeline imports this module when its worker starts, so the ~1 s import happens once, before
the worker forks its pool, instead of in each pool child on its first page (the pipeline draws
pages in their own task, after the verdict is published: `worker.pipeline.sinks.ReportShelf.html`).
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterable, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, Final

from reports.bounds import bounded
from reports.plots import MARKER_STYLE, Plot, render_plots
from reports.tables import format_cell
from shared.models import (
    Cell,
    GateName,
    GateResult,
    GateStatus,
    Handoff,
    Quote,
    Report,
    Table,
    iso_utc,
)
from shared.times import duration_text

if TYPE_CHECKING:
    from worker.evidence.case import Evidence

__all__ = ["CSP", "HTML_TYPE", "escape", "html_key", "render_html"]

HTML_TYPE: Final = "text/html; charset=utf-8"

CSP: Final = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
"""Nothing but inline styles and data-URI images: the report cannot load or send anything."""


_UNSAFE: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_GATE_TITLES: Final[dict[GateName, str]] = {
    GateName.LIVENESS: "Liveness",
    GateName.RESOURCES: "Resources",
    GateName.ROLLOUTS: "Rollouts",
    GateName.DYNAMICS: "Dynamics",
    GateName.DUTY_CYCLE: "Duty cycle",
}
_STATUS_CLASS: Final[dict[GateStatus, str]] = {
    GateStatus.PASS: "s-pass",
    GateStatus.FAIL: "s-fail",
    GateStatus.ERROR: "s-error",
    GateStatus.NA: "s-na",
}

_STYLE: Final = """
:root { --ink:#1f2933; --muted:#52606d; --line:#d9e2ec; --bg:#f5f7fa;
  --kill:#b71c1c; --nokill:#1b5e20; --error:#e65100; --na:#7b8794; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color:var(--ink); background:var(--bg); }
main { max-width: 980px; margin: 0 auto; padding: 16px 20px 40px; }
header.verdict { color:#fff; padding:18px 20px; border-radius:10px; margin-bottom:14px; }
.v-kill { background:var(--kill); } .v-no-kill { background:var(--nokill); }
.v-error { background:var(--error); }
header.verdict h1 { margin:0; font-size:38px; letter-spacing:1px; }
header.verdict .facts { display:flex; flex-wrap:wrap; gap:6px 22px; margin-top:6px;
  font-size:16px; }
header.verdict .facts b { font-weight:700; }
header.verdict .job { margin-top:8px; font-size:13px; opacity:.92; overflow-wrap:anywhere; }
section { background:#fff; border:1px solid var(--line); border-radius:10px; padding:14px 18px;
  margin-bottom:14px; }
h2 { font-size:18px; margin:0 0 8px; } h3 { font-size:16px; margin:0 0 6px; }
.strip { display:flex; flex-wrap:wrap; gap:8px; }
.strip a { text-decoration:none; color:inherit; border:1px solid var(--line); border-radius:8px;
  padding:6px 10px; background:#fff; }
.badge { display:inline-block; min-width:54px; text-align:center; border-radius:6px;
  padding:1px 8px; font-weight:700; font-size:13px; color:#fff; }
.s-pass { background:var(--nokill); } .s-fail { background:var(--kill); }
.s-error { background:var(--error); } .s-na { background:var(--na); }
.proof { border:2px solid var(--kill); } .missing-proof { border:2px dashed var(--error); }
dl.facts { display:grid; grid-template-columns: max-content 1fr; gap:4px 14px; margin:0; }
dl.facts dt { color:var(--muted); font-weight:600; }
dl.facts dd { margin:0; overflow-wrap:anywhere; }
ul.quotes { list-style:none; padding:0; margin:8px 0 0; }
ul.quotes li { border-left:3px solid var(--line); padding:4px 10px; margin:6px 0;
  background:var(--bg); }
ul.quotes code { white-space:pre-wrap; overflow-wrap:anywhere; font-size:13px; }
ul.quotes .where { display:block; color:var(--muted); font-size:12px; }
pre.details { background:var(--bg); padding:8px 10px; border-radius:6px; overflow-x:auto;
  font-size:12px; margin:8px 0 0; }
.summary { margin:2px 0 0; }
table.data { border-collapse:collapse; margin:10px 0 0; font-size:12px; display:block;
  overflow-x:auto; }
table.data caption { text-align:left; color:var(--muted); font-weight:600; padding-bottom:2px; }
table.data th, table.data td { border-bottom:1px solid var(--line); padding:2px 8px;
  text-align:left; white-space:nowrap; }
table.data td.num { text-align:right; font-variant-numeric:tabular-nums; }
section.gate { border:none; border-top:1px solid var(--line); border-radius:0; margin:0;
  padding:12px 0 10px; }
figure { margin:0 0 16px; } figure img { width:100%; height:auto; border:1px solid var(--line);
  border-radius:6px; background:#fff; }
figcaption { color:var(--muted); font-size:12px; margin-top:2px; }
.nodata { border:1px dashed var(--na); border-radius:6px; padding:18px; color:var(--muted);
  background:var(--bg); text-align:center; }
.legend span { margin-right:14px; font-size:12px; white-space:nowrap; }
footer { color:var(--muted); font-size:12px; text-align:center; margin-top:20px; }
"""


def escape(text: object) -> str:
    """HTML-escaped text, with control and bidi-override characters shown as escapes."""
    visible = _UNSAFE.sub(lambda m: _visible(m.group()), str(text))
    return html.escape(visible, quote=True)


def _visible(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def html_key(json_key: str) -> str:
    """The S3 key of the HTML report stored beside a JSON report (same key, `.html`)."""
    return json_key.removesuffix(".json") + ".html"


# --- pieces ---------------------------------------------------------------------------------------


def _as_quote(item: Any) -> Quote:
    return item if isinstance(item, Quote) else Quote.model_validate(item)


def _quotes(items: Iterable[Any]) -> str:
    rows = []
    for item in items:
        q = _as_quote(item)
        where = q.source if q.line is None else f"{q.source}:{q.line}"
        stamp = iso_utc(q.timestamp)
        origin = f"{where} · {stamp}" if stamp else where
        rows.append(
            f'<li><code>{escape(q.text)}</code><span class="where">{escape(origin)}</span></li>'
        )
    return f'<ul class="quotes">{"".join(rows)}</ul>' if rows else ""


def _badge(status: GateStatus) -> str:
    return f'<span class="badge {_STATUS_CLASS[status]}">{escape(status.value)}</span>'


def _facts(pairs: Sequence[tuple[str, str | None]]) -> str:
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in pairs if v)
    return f'<dl class="facts">{rows}</dl>'


def _header(report: Report) -> str:
    verdict = report.verdict.value
    ids = ", ".join(report.event_ids) or (report.event_id or "none")
    return (
        f'<header class="verdict v-{verdict.lower()}" id="verdict">'
        f"<h1>{escape(verdict)}</h1>"
        f'<div class="facts"><span>confidence <b>{escape(report.confidence.value)}</b></span>'
        f"<span>mode <b>{escape(report.mode.value)}</b></span>"
        f"<span>captured <b>{escape(iso_utc(report.captured_at))}</b></span></div>"
        f'<div class="job">job {escape(report.job_id)} · evidence {escape(report.evidence_dir)}'
        f" · event ids {escape(ids)}</div></header>"
    )


def _proof(report: Report) -> str:
    """The kill proof (docs/interface.md#the-report, `kill_proof`): present exactly when the verdict
    is KILL."""
    proof = report.kill_proof
    if proof is None:
        return ""
    facts = _facts(
        [
            ("rule", proof.rule),
            ("mechanism", proof.mechanism),
            ("established at", iso_utc(proof.established_at)),
        ]
    )
    return (
        f'<section class="proof" id="kill-proof"><h2>Kill proof</h2>{facts}'
        f"{_quotes(proof.evidence)}</section>"
    )


def _second_look(report: Report) -> str:
    """The second look before a stall KILL, when one was taken: what each look saw and when."""
    look = report.second_look
    if look is None:
        return ""
    facts = _facts(
        [
            ("outcome", look.outcome.value),
            ("waited", duration_text(look.waited_s)),
            ("first look", iso_utc(look.first_at)),
            ("second look", iso_utc(look.taken_at)),
            ("what it saw", look.summary),
            ("what moved", "; ".join(look.moved) or None),
        ]
    )
    return (
        f'<section class="second-look" id="second-look"><h2>Second look</h2>{facts}'
        f"{_quotes(look.evidence)}</section>"
    )


def _strip(report: Report) -> str:
    count = "unknown" if report.restarts.count is None else str(report.restarts.count)
    chips = [f'<a href="#restarts">Restarts <b>{escape(count)}</b></a>']
    for name in GateName:
        gate = report.gates[name]
        chips.append(f'<a href="#gate-{name.value}">{_GATE_TITLES[name]} {_badge(gate.status)}</a>')
    return f'<section id="glance"><div class="strip">{"".join(chips)}</div></section>'


def _handoff(handoff: Handoff | None) -> str:
    if handoff is None:
        return ""
    facts = _facts(
        [
            ("likely cause", handoff.likely_cause),
            ("component", handoff.component),
            ("proposed behaviour", handoff.proposed_behavior),
            ("test that proves the fix", handoff.test),
        ]
    )
    return f"<h3>Handoff</h3>{facts}{_quotes(handoff.evidence)}"


def _judgement(report: Report) -> str:
    facts = _facts(
        [
            ("reasoning", report.reasoning),
            ("next action", report.next_action),
            ("flip signal", report.flip_signal),
        ]
    )
    return f'<section id="judgement"><h2>Judgement</h2>{facts}{_handoff(report.handoff)}</section>'


def _restarts(report: Report) -> str:
    restarts = report.restarts
    count = "unknown" if restarts.count is None else str(restarts.count)
    same = {None: "unknown", True: "yes", False: "no"}[restarts.same_failure]
    facts = _facts([("count", count), ("same failure", same)])
    return (
        f'<section id="restarts"><h2>Restarts</h2>{facts}'
        f'<p class="summary">{escape(restarts.interpretation)}</p>{_quotes(restarts.evidence)}'
        "</section>"
    )


def _table(table: Table) -> str:
    """A gate's table (the text report's per-step dynamics, phase ratios, engines) as an HTML
    table: cells formatted as in the text report, numbers right-aligned."""
    units = table.units or ("",) * len(table.columns)

    def cell(value: Cell, i: int) -> str:
        text = escape(format_cell(value, units[i] if i < len(units) else ""))
        numeric = i > 0 and not isinstance(value, str)
        return f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>"

    head = "".join(f"<th>{escape(column)}</th>" for column in table.columns)
    rows = "".join(
        "<tr>" + "".join(cell(value, i) for i, value in enumerate(row)) + "</tr>"
        for row in table.rows
    )
    return (
        f'<table class="data"><caption>{escape(table.title)}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    )


def _gate(name: GateName, gate: GateResult) -> str:
    details = "\n".join(gate.details)
    table = f'<pre class="details">{escape(details)}</pre>' if details else ""
    tables = "".join(_table(t) for t in gate.tables)
    return (
        f'<section class="gate" id="gate-{name.value}">'
        f"<h3>{_GATE_TITLES[name]} {_badge(gate.status)}</h3>"
        f'<p class="summary">{escape(gate.summary)}</p>{_quotes(gate.evidence)}{table}'
        f"{tables}</section>"
    )


def _legend() -> str:
    spans = "".join(
        f'<span><b style="color:{colour}">{"┆" if style != "-" else "│"}</b> {escape(label)}</span>'
        for colour, style, label in MARKER_STYLE.values()
    )
    return f'<p class="legend">Vertical lines: {spans}; shaded blue: the judged window.</p>'


def _figure(plot: Plot) -> str:
    caption = escape(plot.caption) if plot.caption else ""
    title = f"<h3>{escape(plot.title)}</h3>"
    if plot.png is None:
        body = f'<div class="nodata">No data: {escape(plot.empty or "nothing to draw")}</div>'
    else:
        data = base64.b64encode(plot.png).decode("ascii")
        body = f'<img alt="{escape(plot.title)}" src="data:image/png;base64,{data}">'
    figure = f'<figure id="plot-{escape(plot.slug)}">{title}{body}'
    return f"{figure}<figcaption>{caption}</figcaption></figure>"


def _plots(plots: Sequence[Plot] | None) -> str:
    if plots is None:
        body = '<div class="nodata">No data: the evidence tables were not available to plot.</div>'
        return f'<section id="plots"><h2>Plots</h2>{body}</section>'
    figures = "".join(_figure(p) for p in plots)
    return f'<section id="plots"><h2>Plots</h2>{_legend()}{figures}</section>'


def _inputs(items: Sequence[str]) -> str:
    if not items:
        return ""
    rows = "".join(f"<li>{escape(item)}</li>" for item in items)
    return f'<section id="inputs"><h2>Inputs</h2><ul>{rows}</ul></section>'


def _discrepancies(items: Sequence[str]) -> str:
    if not items:
        return ""
    rows = "".join(f"<li>{escape(item)}</li>" for item in items)
    return f'<section id="discrepancies"><h2>Discrepancies</h2><ul>{rows}</ul></section>'


def _version() -> str:
    try:
        return metadata.version("rl-job-health")
    except metadata.PackageNotFoundError:
        return "unknown"


def render_html(report: Report, evidence: Evidence | None = None) -> str:
    """The whole HTML report; with `evidence`, its plots (drawn here, from the tables).

    Every value is rendered from `bounded(report)`, as in the text and JSON reports: redacted,
    control characters escaped, lists capped. The byte ceiling of those reports does not apply:
    the embedded plot images alone can be larger.
    """
    report = bounded(report)
    plots = None
    if evidence is not None:
        plots = render_plots(evidence)
    gates = "".join(_gate(name, report.gates[name]) for name in GateName)
    title = f"{report.verdict.value} — {report.job_id} — RL-JOB-HEALTH"
    body = "".join(
        [
            _header(report),
            _proof(report),
            _second_look(report),
            _strip(report),
            _judgement(report),
            _restarts(report),
            f'<section id="gates"><h2>Gates</h2>{gates}</section>',
            _plots(plots),
            _inputs(report.inputs),
            _discrepancies(report.discrepancies),
            f"<footer>rl-job-health {escape(_version())} · read-only: this report offers no "
            "action on the job</footer>",
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )
