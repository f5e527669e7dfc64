"""The secrets corpus through every output: zero leaks (reproduction 4 of issue 9).

A bundle carries every credential of the corpus in every position — the head of the log (a config
dump), traceback and error lines, the launched argv, the watcher's `artifacts.errors`, trial
exceptions, and a probe directory (attempt errors, stacks, a failed command's output); live probes
answered by spies carry them too. Every output is then read back whole: the text and JSON reports
(stdout and `--out`), `parse` tables (CSV and Parquet) and messages, frozen evidence (JSON and
Parquet), the probe files a live capture writes, the verdict entry, and every object the pipeline
stores (an in-memory store here; `tests/integration/test_secrets_s3.py` reads moto's S3 back).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import fakeredis
import polars as pl
import pytest
from click.testing import CliRunner

from testkit.keys import TEST_KEY, TEST_KEYS
from tests.security.bundles import NOW, crafted_bundle
from tests.security.corpus import SAMPLES, corpus_lines, leaks
from tests.security.spies import Spies, make_spybin
from worker.cli import main
from worker.pipeline.sinks import S3ReportSink, VerdictStreamSink

LINES = corpus_lines()
CARRIERS = [carrier for sample in SAMPLES for carrier in sample.carriers]


def secret_bundle(root: Path, name: str, *, metrics: bool = True) -> Path:
    """A job whose manifest, log, trials and pod log carry the whole corpus."""
    errors = [f"torch.OutOfMemoryError: CUDA out of memory. {line}" for line in LINES[::4]]
    return crafted_bundle(
        root,
        name,
        head=LINES,
        lines=[*errors, *LINES],
        steps=3 if metrics else 0,
        trials=[(f"task-{i}__x", "RuntimeError", c) for i, c in enumerate(CARRIERS)],
        argv=["python", "-m", "skyrl_train.entrypoints.main_base", *CARRIERS],
        manifest={"artifacts": {"errors": [f"sync failed: {c}" for c in CARRIERS]}},
    )


def secret_probes(directory: Path) -> Path:
    """A recorded probe directory whose attempts, controller, stacks and a failure hold secrets."""
    directory.mkdir(parents=True)
    stack = 'Thread 41 (idle): "MainThread"\n    all_reduce (torch/distributed.py:2050)\n'
    for i, carrier in enumerate(CARRIERS):
        stack += f"        token_{i} = {carrier!r}\n"
    (directory / "stacks").mkdir()
    for n in (1, 2):
        (directory / "stacks" / f"ops_rl-job_0-pid41-{n}.txt").write_text(stack)
    attempts = [
        {"task_id": "/ops/rl-job/0", "attempt_id": i, "state": "failed", "exit_code": 1,
         "error": f"RuntimeError: {carrier}", "started_at_ms": 1, "finished_at_ms": 2}
        for i, carrier in enumerate(CARRIERS)
    ]  # fmt: skip
    (directory / "attempts.json").write_text(json.dumps(attempts))
    controller = {"job_id": "/ops/rl-job", "state": "running", "error": CARRIERS[0], "tasks": []}
    (directory / "controller.json").write_text(json.dumps(controller))
    (directory / "failed").mkdir()
    (directory / "failed" / "gpus.txt").write_text("\n".join(LINES))
    command = {"argv": ["nvidia-smi", f"--token={CARRIERS[-1]}"], "exit_code": 1,
               "started_at": NOW.isoformat(), "output": "failed/gpus.txt"}  # fmt: skip
    header = {"captured_at": NOW.isoformat(), "backend": "iris", "job_id": "/ops/rl-job",
              "commands": [command]}  # fmt: skip
    (directory / "probes.json").write_text(json.dumps(header))
    return directory


def _files(directory: Path) -> str:
    """Every file under `directory` as text; Parquet tables dumped cell by cell."""
    parts = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        if path.suffix == ".parquet":
            parts.append(str(pl.read_parquet(path).rows()))
        else:
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def _spy_replies(spies: Spies) -> None:
    """Every live probe answers with secrets: summary, attempts, log tail, ps, py-spy, GPUs."""
    task = {"task_id": "/ops/rl-job/0", "state": 3, "error": CARRIERS[2]}
    summary = {"job_id": "/ops/rl-job", "state": 3, "error": CARRIERS[1], "tasks": [task]}
    rows = "\n".join(f'/ops/rl-job/0,{i},5,1,"{c}",1,2' for i, c in enumerate(CARRIERS))
    attempts = "task_id,attempt_id,state,exit_code,error,started_at_ms,finished_at_ms\n" + rows
    ps = "  PID  PPID COMMAND\n    1     0 ps -ww -eo pid,ppid,args\n"
    ps += f"   41     0 python train.py {' '.join(CARRIERS)}\n"
    stack = 'Thread 41 (idle): "MainThread"\n' + "\n".join(f"    x = {c!r}" for c in CARRIERS)
    spies.reply(r"job --help", "Commands:\n  summary\n  logs\n")
    spies.reply(r"job summary", json.dumps(summary))
    spies.reply(r"query", attempts)
    spies.reply(r"job logs", "\n".join(LINES))
    spies.reply(r" ps -ww", ps)
    spies.reply(r"py-spy dump", stack)
    spies.reply(r"nvidia-smi", "\n".join(LINES), exit_code=1)


@dataclass
class Outputs:
    texts: dict[str, str]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outputs]:
    """Every output of every path the corpus can take, read back whole."""
    root = tmp_path_factory.mktemp("leaks")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLHEALTH_VERDICT_KEY", TEST_KEY)  # set up before any test's own env
        yield Outputs(_collect(root, patch))


def _diagnose(*args: str) -> str:
    result = CliRunner().invoke(main, ["diagnose", *args, "--now", NOW.isoformat()])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.output + (result.stderr or "")


def _parse(path: Path, out: Path, fmt: str) -> str:
    result = CliRunner().invoke(main, ["parse", str(path), "--out", str(out), "--format", fmt])
    return result.output + (result.stderr or "") + _files(out)


def _pipeline(job_dir: Path, root: Path, probes: Path) -> dict[str, str]:
    """The pipeline's capture, gates and verdict on the bundle; every stored object read back."""
    from shared.models import Event
    from shared.settings import Settings
    from worker.pipeline.steps import GATE_NAMES, Pipeline
    from worker.pipeline.store import MemoryStore

    settings = Settings(bundle_root=root, cache_dir=root / "cache")
    store = MemoryStore()
    pipeline = Pipeline(settings, store, fakeredis.FakeRedis())
    event = Event(
        event_id="evt-leak", job_dir=str(job_dir.relative_to(root)), published_at=NOW, now=NOW,
        probes=str(probes.relative_to(root)),
    )  # fmt: skip
    pipeline.events.archive(event)
    pipeline.capture(event.event_id, event.event_id, claim="t")
    results = [pipeline.gate(event.event_id, name) for name in GATE_NAMES]
    entry = pipeline.verdict(results, event.event_id, event.event_id)
    assert pipeline.shelf.html(entry, event.event_id)  # the HTML page, drawn after publish
    objects = {key: store.get(key).decode("utf-8", "replace") for key in store.keys("")}
    parquet = {
        k: str(pl.read_parquet(store.get(k)).rows()) for k in objects if k.endswith(".parquet")
    }
    return {
        "pipeline: S3 reports": "\n".join(
            v for k, v in objects.items() if k.startswith("reports/")
        ),
        "pipeline: frozen evidence": "\n".join(
            parquet.get(k, v) for k, v in objects.items() if k.startswith("evidence/")
        ),
        "pipeline: verdict entry": json.dumps(entry),
    }


def _collect(root: Path, patch: pytest.MonkeyPatch) -> dict[str, str]:
    from worker.diagnosis import collect_evidence, judge
    from worker.evidence.frozen import freeze
    from worker.pipeline.store import MemoryStore

    quiet = secret_bundle(root / "bundles", "rl-quiet", metrics=False)
    job = secret_bundle(root / "bundles", "rl-job")
    probes = secret_probes(root / "bundles" / "probes")
    out = root / "out"
    texts = {
        "diagnose text (no metrics, log head)": _diagnose(str(quiet)),
        "diagnose text": _diagnose(str(job), "--probes", str(probes)),
        "diagnose json": _diagnose(str(job), "--probes", str(probes), "--format", "json"),
    }
    _diagnose(str(job), "--probes", str(probes), "--out", str(out))
    texts["diagnose --out report.txt/json"] = _files(out)
    texts["parse csv tables and messages"] = _parse(job, root / "csv", "csv")
    texts["parse parquet tables"] = _parse(job, root / "parquet", "parquet")
    texts["parse no-metrics message"] = _parse(quiet / "finelog.log", root / "q", "csv")
    evidence = collect_evidence(job, now=NOW, probes_dir=probes)
    freeze(evidence, root / "frozen")
    texts["frozen evidence"] = _files(root / "frozen")
    report = judge(evidence, event_id="evt-1")
    stored = S3ReportSink(MemoryStore(), TEST_KEYS)(report, cluster="cw", user="ops", job="rl-job")
    texts["verdict entry"] = VerdictStreamSink.entry(report, stored).model_dump_json()
    texts.update(_pipeline(job, root / "bundles", probes))
    texts["live probe files"] = _live_probes(root, job, patch)
    return texts


def _live_probes(root: Path, job: Path, patch: pytest.MonkeyPatch) -> str:
    """`diagnose --backend iris` with spies answering secrets; the probe files it wrote."""
    spies = make_spybin(root / "spies" / "bin")
    _spy_replies(spies)
    for name, value in {**spies.env(), "RLHEALTH_TOOL_PATH": str(spies.bin),
                        "RLHEALTH_IRIS_COMMAND": str(spies.bin / "iris"),
                        "RLHEALTH_IRIS_CONTROLLER_URL": "http://controller.test",
                        "RLHEALTH_PROBE_INTERVAL_S": "0.01"}.items():  # fmt: skip
        patch.setenv(name, value)
    patch.setenv("PATH", f"{spies.bin}:{__import__('os').environ['PATH']}")
    later = (NOW + timedelta(hours=1)).isoformat()
    out = root / "live"
    CliRunner().invoke(
        main, ["diagnose", str(job), "--backend", "iris", "--now", later, "--out", str(out)]
    )
    assert any(c[1:3] == ["--controller-url=http://controller.test", "task"] or "py-spy" in c
               for c in spies.calls()), spies.calls()  # fmt: skip
    return _files(out / "probes")


OUTPUT_NAMES = [
    "diagnose text (no metrics, log head)",
    "diagnose text",
    "diagnose json",
    "diagnose --out report.txt/json",
    "parse csv tables and messages",
    "parse parquet tables",
    "parse no-metrics message",
    "frozen evidence",
    "verdict entry",
    "pipeline: S3 reports",
    "pipeline: frozen evidence",
    "pipeline: verdict entry",
    "live probe files",
]
# The outputs that quote the corpus at all (the verdict entries hold no quote): in those the
# redaction markers must show, or the zero would prove nothing.
QUOTING = [name for name in OUTPUT_NAMES if "verdict entry" not in name]


@pytest.mark.parametrize("name", OUTPUT_NAMES)
def test_no_secret_of_the_corpus_in_any_output(outputs: Outputs, name: str) -> None:
    """Zero credentials of the corpus in this output, read back whole."""
    assert leaks(outputs.texts[name]) == []


@pytest.mark.parametrize("name", QUOTING)
def test_the_corpus_reached_the_output_redacted(outputs: Outputs, name: str) -> None:
    """The corpus did reach this output (so the zero above means something): as markers."""
    assert "<redacted:" in outputs.texts[name]


def test_leak_counts_per_output(outputs: Outputs, capsys: pytest.CaptureFixture[str]) -> None:
    """The count of leaked corpus secrets per output, printed for the record: all zero."""
    counts = {name: len(leaks(text)) for name, text in outputs.texts.items()}
    with capsys.disabled():
        print("\nsecrets corpus, leaks per output:", json.dumps(counts, indent=1))
    assert set(counts) == set(OUTPUT_NAMES) and sum(counts.values()) == 0
