"""Issue 28, Medium 11 and a low item: text from the evidence drawn into the plots.

`diagnose --format html` (and `--out`) draws its plots from evidence not yet frozen, so a phase
name holding an `hf_` token was drawn unredacted into the phase plot's legend image. A phase named
in `$...$` was read by matplotlib as mathtext (a bad one stopped the plot), and a phase named
`timestamp` clashed with a column of the table drawn (the plot stopped too). Now every label from
the evidence is redacted and drawn as literal text, and phases are columns of their own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from reports import plots
from tests.security.corpus import HF
from tests.unit.test_pipeline_logcache import NOW
from worker.diagnosis import collect_evidence
from worker.evidence.case import Evidence

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/logs/skyrl_gsm8k_yottalabs.log"


def _evidence(tmp_path: Path, phase: str) -> Evidence:
    """A job whose `sync_weights` phase is named `phase`."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "finelog.log").write_text(FIXTURE.read_text().replace("'sync_weights'", f"'{phase}'"))
    return collect_evidence(job, now=NOW)


def _drawn(evidence: Evidence, monkeypatch: pytest.MonkeyPatch) -> tuple[plots.Plot, list[str]]:
    """The phase plot, and every text its figure draws (read before it becomes a PNG)."""
    texts: list[str] = []
    original = plots._png

    def recording(figure: Figure) -> bytes:
        png = original(figure)  # drawn first: what the PNG shows
        texts.extend(t.get_text() for t in figure.findobj(Text))
        return png

    monkeypatch.setattr(plots, "_png", recording)
    found = {plot.slug: plot for plot in plots.render_plots(evidence)}
    return found["phases"], texts


def test_a_token_in_a_phase_name_is_not_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A phase named by an `hf_` token is drawn redacted in the phase plot's legend."""
    phase, texts = _drawn(_evidence(tmp_path, f"upload {HF}"), monkeypatch)
    assert phase.png is not None
    assert not [t for t in texts if HF in t or HF[:12] in t]
    assert any("<redacted:" in t for t in texts)


@pytest.mark.parametrize("name", [r"$\frac{1}{$", r"$\notacommand{x}$", "timestamp", "step"])
def test_a_phase_name_never_stops_the_phase_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A phase named in mathtext (even broken) or named like a column of the drawn table is a
    label like any other: the plot is drawn and shows the name as written."""
    phase, texts = _drawn(_evidence(tmp_path, name), monkeypatch)
    assert phase.png is not None, phase.empty
    shown = [t for t in texts if name in t.replace(r"\$", "$")]
    assert shown, texts
