"""Unforgeable, bounded reports: every value cleaned, every list capped, the whole under a ceiling.

`bounded(report, limits)` returns a copy of the report (any model inside it, whatever fields it
has) in which every string is redacted and has its control characters escaped (so no evidence
value can start a line of the text report or carry a terminal escape), every string is cut by bytes
with a visible marker, and every list keeps its first `limits.items` entries followed by one
`… and N more` entry (a marker quote for lists of quotes). The renderers try `LIMITS` in turn until
the rendering fits `MAX_REPORT_BYTES`; `ceiling` is the last resort for text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, Final, TypeVar

from pydantic import BaseModel

from shared.models import Quote, Report
from shared.redact import clean_cut

__all__ = [
    "LIMITS",
    "MAX_REPORT_BYTES",
    "OMITTED_SOURCE",
    "Limits",
    "bounded",
    "bounded_rendering",
    "ceiling",
    "render_bounded",
]

MAX_REPORT_BYTES: Final = 256 * 1024
OMITTED_SOURCE: Final = "(omitted)"

_M = TypeVar("_M", bound=BaseModel)


@dataclass(frozen=True)
class Limits:
    """How many entries a list keeps and how many bytes a string keeps."""

    items: int
    text_bytes: int


LIMITS: Final = (Limits(20, 4096), Limits(5, 2048), Limits(1, 1024), Limits(0, 512))


def _more(sample: object, rest: int) -> object:
    """The entry that stands for `rest` entries left out, shaped like the ones kept."""
    text = f"… and {rest} more"
    return Quote(source=OMITTED_SOURCE, text=text) if isinstance(sample, Quote) else text


def _bound(value: Any, limits: Limits) -> Any:
    if type(value) is str:  # not the str-based enums (verdict, mode, status), which are fixed
        return clean_cut(value, limits.text_bytes)
    if isinstance(value, BaseModel):
        return _bound_model(value, limits)
    if isinstance(value, tuple | list):
        kept = tuple(_bound(item, limits) for item in value[: limits.items])
        rest = len(value) - len(kept)
        return (*kept, _more(value[0], rest)) if rest else kept
    if isinstance(value, dict):
        return {key: _bound(item, limits) for key, item in value.items()}
    return value


def _bound_model(model: _M, limits: Limits) -> _M:
    fields = type(model).model_fields
    return model.model_copy(update={name: _bound(getattr(model, name), limits) for name in fields})


def bounded(report: Report, limits: Limits = LIMITS[0]) -> Report:
    """The report with every string cleaned and cut and every list capped (see the module)."""
    return _bound_model(report, limits)


def ceiling(text: str, limit: int = MAX_REPORT_BYTES) -> str:
    """`text` cut at the last whole line under `limit` bytes, with a line saying how much went."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    kept = data[: limit - 80].decode("utf-8", errors="ignore").rsplit("\n", 1)[0]
    gone = len(data) - len(kept.encode("utf-8"))
    return f"{kept}\n… report cut at {limit} bytes ({gone} bytes more)\n"


def render_bounded(report: Report, render: Callable[[Report], str]) -> str:
    """`render` of the report under the tightest-needed `LIMITS`, within MAX_REPORT_BYTES."""
    text = ""
    for limits in LIMITS:
        text = render(bounded(report, limits))
        if len(text.encode("utf-8")) <= MAX_REPORT_BYTES:
            return text
    return ceiling(text)


def bounded_rendering(render: Callable[[Report], str]) -> Callable[[Report], str]:
    """Decorate a renderer so it always renders the bounded report (`render_bounded`)."""

    @wraps(render)
    def rendered(report: Report) -> str:
        return render_bounded(report, render)

    return rendered
