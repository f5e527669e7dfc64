"""The plots of the HTML report: drawn from the evidence tables, with the event lines, the judged
window and a reason instead of an image when there is nothing to draw."""

from __future__ import annotations

import io
import math
from datetime import timedelta

import numpy as np
import polars as pl
import pytest
from matplotlib import image as mimage
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from reports import plots as plots_module
from reports.plots import ENGINE_BUCKETS, MAX_POINTS, Plot, markers, render_plots
from shared.models import Mode
from shared.settings import Thresholds
from tests import factories as f
from worker.evidence import schema
from worker.evidence.model import AttemptRecord, LogTables, ProbeEvidence, StackDump

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _by_slug(plots: tuple[Plot, ...]) -> dict[str, Plot]:
    return {plot.slug: plot for plot in plots}


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(mimage.imread(io.BytesIO(png), format="png"))


def _standard(n: int = 30, **series: list[float | None]) -> f.Evidence:
    base: dict[str, list[float | None]] = {
        "reward/avg_raw_reward": [0.1 + 0.01 * i for i in range(n)],
        "policy/policy_entropy": [1.0 - 0.001 * i for i in range(n)],
        "policy/raw_grad_norm": [0.5] * n,
    }
    logs = f.logs(metrics=f.metric_rows(base | series))
    return f.evidence(log_tables=logs)


def test_a_standard_run_draws_every_series_it_logged_and_names_what_it_lacks() -> None:
    """Reward, entropy and grad norm become real PNGs; TIS (not logged) names the keys sought."""
    plots = _by_slug(render_plots(_standard()))
    for slug in ("reward", "entropy", "grad_norm"):
        png = plots[slug].png
        assert png is not None and png.startswith(PNG_SIGNATURE), slug
        assert float(_pixels(png).std()) > 0.01, f"{slug} is blank"
    assert plots["tis"].png is None
    assert plots["tis"].empty is not None and "policy/tis/imp_ratio_mean" in plots["tis"].empty
    assert "trials" not in plots and "duty_cycle" not in plots  # a standard run has no trials


def test_no_log_at_all_says_so_on_every_plot() -> None:
    """Evidence without a trainer log draws nothing and every plot says why."""
    plots = render_plots(f.evidence())
    assert plots and all(p.png is None for p in plots)
    assert all(p.empty and p.empty.startswith("no trainer log in the evidence") for p in plots)


def test_the_judged_window_is_the_last_w_steps_that_carry_a_canonical_metric() -> None:
    """With W=10 and 30 steps the window is steps 21..30; with 9 steps it is all of them."""
    limits = Thresholds()
    assert limits.min_window_steps == 10
    ctx = plots_module._context(_standard(30), _standard(30).logs or f.logs())
    assert ctx.window_steps == (21, 30)
    short = _standard(9)
    assert plots_module._context(short, short.logs or f.logs()).window_steps == (1, 9)
    assert ctx.window_times is not None and ctx.window_times[1] == f.at(1)


def test_markers_carry_restarts_newest_progress_stack_dumps_and_the_capture() -> None:
    """Attempt boundaries and controller attempts 30 s apart make one restart line; a metric
    stamped after the capture is not the newest progress; every dump and the capture are lines."""
    boundary = f.at(40)
    logs = f.logs(
        metrics=[
            *f.metric_rows({"reward/avg_raw_reward": [0.1, 0.2, 0.3]}),
            {
                "step": 4,
                "key": "reward/avg_raw_reward",
                "value": 0.4,
                "timestamp": f.NOW + timedelta(hours=2),
                "source": "finelog.log",
                "line": 9,
                "attempt": 0,
            },
        ],
        resumes=[
            {
                "kind": "attempt_boundary",
                "timestamp": boundary,
                "source": "finelog.log",
                "line": 3,
                "attempt": 1,
                "text": "[iris setup]",
            }
        ],
    )
    attempt = AttemptRecord(
        task_id="t",
        attempt_id=1,
        state="running",
        started_at_ms=int((boundary + timedelta(seconds=30)).timestamp() * 1000),
    )
    dumps = tuple(
        StackDump(
            target="t",
            pid=1,
            n=n,
            source=f"probes/stacks/t-pid1-{n}.txt",
            captured_at=f.at(5) + timedelta(seconds=6 * n),
            text="",
        )
        for n in (1, 2)
    )
    probes = ProbeEvidence(directory="probes", attempts=(attempt,), stacks=dumps)
    found = markers(f.evidence(log_tables=logs, probes=probes))
    kinds = [(m.kind, m.at) for m in found]
    assert [k for k, _ in kinds].count("restart") == 1
    assert ("progress", f.at(1)) in kinds  # not the row stamped two hours after the capture
    assert [k for k, _ in kinds].count("stack") == 2
    assert kinds[-1] == ("capture", f.NOW)


def test_restarts_a_minute_and_more_apart_stay_two_lines() -> None:
    """Two attempt boundaries 61 s apart are two restarts (the merge is for one restart only)."""
    rows = [
        {
            "kind": "attempt_boundary",
            "timestamp": f.at(10) + timedelta(seconds=s),
            "source": "finelog.log",
            "line": 1 + s,
            "attempt": 1,
            "text": "[iris setup]",
        }
        for s in (0, 61)
    ]
    found = markers(f.evidence(log_tables=f.logs(resumes=rows)))
    assert [m.kind for m in found].count("restart") == 2


def test_non_finite_values_are_left_out_and_counted() -> None:
    """A NaN and an inf reward are not drawn and the caption says how many were left out; an
    all-NaN series says every value is non-finite instead of drawing an empty frame."""
    rewards: list[float | None] = [0.1 * i for i in range(12)]
    rewards[3], rewards[7] = math.nan, math.inf
    plots = _by_slug(render_plots(_standard(12, **{"reward/avg_raw_reward": rewards})))
    assert plots["reward"].png is not None
    assert "2 non-finite value(s) not drawn" in plots["reward"].caption
    nan_only = _by_slug(render_plots(_standard(12, **{"policy/raw_grad_norm": [math.nan] * 12})))
    assert nan_only["grad_norm"].png is None
    assert "every logged grad norm value is non-finite" in (nan_only["grad_norm"].empty or "")


def test_rows_without_timestamps_are_drawn_by_step() -> None:
    """A series with an unstamped row falls back to a step axis and says the event lines are out."""
    rows = f.metric_rows({"reward/avg_raw_reward": [0.1, 0.2, 0.3]})
    rows[1]["timestamp"] = None
    plots = _by_slug(render_plots(f.evidence(log_tables=f.logs(metrics=rows))))
    assert plots["reward"].png is not None
    assert "drawn by step, without the event lines" in plots["reward"].caption


def _long_frame(table: dict[str, pl.DataType], n: int, **columns: object) -> pl.DataFrame:
    """`n` rows of `table`, one step a minute ending at NOW, built in one go (no row dicts)."""
    steps = np.arange(1, n + 1, dtype=np.int64)
    first_us = int((f.NOW - timedelta(minutes=n)).timestamp() * 1_000_000)
    stamps = pl.from_epoch(pl.Series(first_us + steps * 60_000_000), time_unit="us")
    base = {
        "step": steps,
        "timestamp": stamps.dt.replace_time_zone("UTC"),
        "source": "finelog.log",
        "line": steps * 10,
        "attempt": 0,
    }
    built = pl.DataFrame(base | columns)
    return built.select(
        [
            pl.col(c).cast(t) if c in built.columns else pl.lit(None, t).alias(c)
            for c, t in table.items()
        ]
    )


def _figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every figure the plots turn into a PNG, kept so a test can count what was drawn."""
    figures: list[Figure] = []
    real = plots_module._png

    def spy(figure: Figure) -> bytes:
        figures.append(figure)
        return real(figure)

    monkeypatch.setattr(plots_module, "_png", spy)
    return figures


def _line_points(figure: Figure) -> list[int]:
    """Points of each data line (Line2D) of a figure; event lines are collections, not lines."""
    return [len(line.get_xdata()) for ax in figure.axes for line in ax.get_lines()]


def test_a_huge_series_draws_a_bounded_number_of_points_and_keeps_its_spike_and_last_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200,000 steps of reward with one spike: every line drawn has at most MAX_POINTS points, the
    spike and the newest step are among them, and the caption says `N of 200,000 points`."""
    n, spike = 200_000, 123_457
    reward = np.sin(np.arange(n) / 300.0)
    reward[spike - 1] = 25.0
    reward[-1] = -3.0  # the newest step: a drop the plot must not thin away
    metrics = _long_frame(
        schema.METRICS, n, key="reward/avg_raw_reward", value=reward, origin="mirror"
    )
    figures = _figures(monkeypatch)
    plots = _by_slug(render_plots(f.evidence(log_tables=LogTables(metrics=metrics))))
    plot = plots["reward"]
    assert plot.png is not None and len(figures) == 1
    drawn = _line_points(figures[0])
    assert len(drawn) == 2 and max(drawn) <= MAX_POINTS  # the series and its moving mean
    assert plot.rows == n and plot.points == drawn[0]
    assert f"{plot.points:,} of {n:,} points drawn" in plot.caption
    values = figures[0].axes[0].get_lines()[0].get_ydata()
    assert 25.0 in values and values[-1] == -3.0


def test_a_series_of_max_points_is_drawn_whole_and_one_more_is_downsampled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MAX_POINTS steps: every point drawn, no note; MAX_POINTS + 1: fewer, and the caption
    says so."""
    figures = _figures(monkeypatch)
    for n, whole in ((MAX_POINTS, True), (MAX_POINTS + 1, False)):
        metrics = _long_frame(
            schema.METRICS, n, key="policy/raw_grad_norm", value=np.ones(n), origin="mirror"
        )
        plot = _by_slug(render_plots(f.evidence(log_tables=LogTables(metrics=metrics))))[
            "grad_norm"
        ]
        assert (plot.points == n) is whole and plot.rows == n
        assert ("points drawn" in plot.caption) is not whole
        assert _line_points(figures[-1]) == [plot.points]


def test_a_huge_phase_table_stacks_a_bounded_number_of_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """60,000 steps of four phases and the step total: the stack and the total line are drawn from
    at most MAX_POINTS steps, one phase's single slow step among them."""
    n, slow = 60_000, 41_234
    frames = []
    for phase in ("generate", "train", "ref", "step"):
        seconds = np.full(n, 30.0 if phase != "step" else 95.0)
        if phase == "ref":
            seconds[slow - 1] = 600.0
        frames.append(_long_frame(schema.PHASES, n, phase=phase, seconds=seconds))
    figures = _figures(monkeypatch)
    evidence = f.evidence(log_tables=LogTables(phases=pl.concat(frames)))
    plot = _by_slug(render_plots(evidence))["phases"]
    assert plot.png is not None and plot.rows == n and plot.points <= MAX_POINTS
    (total,) = figures[0].axes[0].get_lines()
    assert len(total.get_xdata()) == plot.points
    layers = [c for c in figures[0].axes[0].collections if isinstance(c, PolyCollection)]
    assert len(layers) == 3  # generate, train, ref stacked
    assert all(len(p.vertices) <= 2 * MAX_POINTS + 3 for c in layers for p in c.get_paths())
    assert f"of {n:,} points drawn" in plot.caption
    assert 600.0 + 60.0 in layers[-1].get_paths()[0].vertices[:, 1]  # the slow step, on top


def test_huge_engine_tables_draw_bounded_buckets_whose_band_keeps_a_queue_spike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100,000 stat lines of one engine, one of them with 500 requests waiting: at most
    ENGINE_BUCKETS + 1 buckets are drawn, the waiting band reaches 500 (the mean alone would
    not), and the caption gives the counts."""
    n, spike = 100_000, 67_891
    waiting = np.full(n, 2, dtype=np.int64)
    waiting[spike] = 500
    engines = _long_frame(
        schema.ENGINES,
        n,
        engine="1@h/000",
        running=np.full(n, 40),
        waiting=waiting,
        kv_cache_pct=np.full(n, 50.0),
    )
    figures = _figures(monkeypatch)
    evidence = f.evidence(log_tables=LogTables(engines=engines))
    plot = _by_slug(render_plots(evidence))["engines"]
    assert plot.png is not None and plot.rows == n and plot.points <= ENGINE_BUCKETS + 1
    assert f"{plot.points:,} buckets of {n:,} samples" in plot.caption
    assert all(points == plot.points for points in _line_points(figures[0]))
    waiting_axes = figures[0].axes[1]
    (band,) = [c for c in waiting_axes.collections if isinstance(c, PolyCollection)]
    assert band.get_paths()[0].vertices[:, 1].max() == 500
    assert max(waiting_axes.get_lines()[0].get_ydata()) < 500  # the mean hides it; the band not


def test_phases_engines_and_agentic_plots_draw_from_their_tables() -> None:
    """Phase timers stack, engine stat lines plot, and trials give outcomes and duty shares."""
    phases = f.phase_rows({"generate": [60.0] * 12, "train": [30.0] * 12, "step": [95.0] * 12})
    engines = [
        {
            "timestamp": f.at(12 - i),
            "engine": f"1@h/00{e}",
            "running": 40 + e,
            "waiting": i % 3,
            "kv_cache_pct": 50.0,
            "source": "finelog.log",
            "line": 100 + i,
            "attempt": 0,
        }
        for i in range(12)
        for e in range(2)
    ]
    trials = f.trials(
        [
            {
                "trial_name": f"t{i}",
                "status": "finished",
                "reward": float(i % 2),
                "exception_type": "DaytonaError" if i % 5 == 0 else None,
                "environment_setup_s": 10.0,
                "agent_setup_s": 2.0,
                "agent_execution_s": 60.0,
                "verifier_s": 5.0,
                "llm_request_s": 40.0,
                "started_at": f.at(30 - i),
                "finished_at": f.at(29 - i),
                "source": f"trace_jobs/t{i}/result.json",
            }
            for i in range(20)
        ]
    )
    evidence = f.evidence(
        mode=Mode.AGENTIC, log_tables=f.logs(phases=phases, engines=engines), trial_tables=trials
    )
    plots = _by_slug(render_plots(evidence))
    for slug in ("phases", "engines", "trials", "duty_cycle"):
        assert plots[slug].png is not None, (slug, plots[slug].empty)
    assert "2 engine(s)" in plots["engines"].caption
    assert "sandbox" in plots["trials"].caption and "reward > 0" in plots["trials"].caption


def test_an_agentic_run_without_trials_says_so() -> None:
    """Agentic evidence without a trials directory keeps both trial plots, each saying why."""
    plots = _by_slug(render_plots(f.evidence(mode=Mode.AGENTIC, log_tables=f.logs())))
    assert plots["trials"].empty == "no finished trial in the trials directory"
    assert plots["duty_cycle"].empty == "no finished trial with phase timings"


def test_a_plot_that_fails_to_draw_says_why_and_the_others_still_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception inside one plot becomes that plot's 'could not draw' note, nothing more."""

    def broken(ctx: object) -> Plot:
        raise ValueError("odd evidence")

    monkeypatch.setattr(plots_module, "_engines", broken)
    plots = _by_slug(render_plots(_standard()))
    assert plots["engines"].empty == "could not draw: ValueError: odd evidence"
    assert plots["reward"].png is not None


def test_tis_draws_the_healthy_band_only_with_the_ratio_it_belongs_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run logging only |log ratio| gets no importance-ratio band on the log-ratio scale; with
    the ratio logged the band is there."""
    bands: list[tuple[float, float]] = []
    real = plots_module.Axes.axhspan

    def spy(self: object, low: float, high: float, **kwargs: object) -> object:
        bands.append((low, high))
        return real(self, low, high, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(plots_module.Axes, "axhspan", spy)
    only_log = _by_slug(
        render_plots(_standard(12, **{"policy/tis/log_ratio_abs_mean": [0.05] * 12}))
    )
    assert only_log["tis"].png is not None and bands == []
    render_plots(_standard(12, **{"policy/tis/imp_ratio_mean": [0.98] * 12}))
    assert bands == [(Thresholds().tis_ratio_mean_min, Thresholds().tis_ratio_mean_max)]
