"""Freezing the evidence of a diagnosis and thawing it back gives the same evidence."""

from __future__ import annotations

import dataclasses
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from shared.settings import Thresholds
from testkit.bundles import write_job_bundle
from tests import factories
from worker.diagnosis import collect_evidence, judge
from worker.evidence import frozen
from worker.evidence.case import Evidence
from worker.evidence.frozen import (
    MARKER,
    PART_ROWS,
    PARTS,
    FrozenEvidenceError,
    PartCache,
    PartRef,
    freeze,
    thaw,
)
from worker.evidence.log_cache import LogCache
from worker.evidence.model import (
    AttemptRecord,
    ControllerView,
    LogTables,
    ProbeCommand,
    ProbeEvidence,
    StackDump,
    TrialTables,
)
from worker.evidence.probes import read_probes

NOW = datetime(2026, 7, 30, 21, 13, 0, 123456, tzinfo=UTC)


def assert_same(left: Any, right: Any, where: str = "evidence") -> None:
    """Field-by-field equality, with frames compared by schema and content."""
    if isinstance(left, pl.DataFrame):
        assert isinstance(right, pl.DataFrame), where
        assert left.schema == right.schema, where
        assert left.equals(right), where
    elif dataclasses.is_dataclass(left) and not isinstance(left, type):
        assert type(left) is type(right), where
        for item in dataclasses.fields(left):
            name = item.name
            assert_same(getattr(left, name), getattr(right, name), f"{where}.{name}")
    else:
        assert left == right, where


def _probes() -> ProbeEvidence:
    stack = StackDump(
        target="task-0",
        pid=4242,
        n=1,
        source="probes/stacks/task-0-pid4242-1.txt",
        captured_at=NOW,
        text='Thread 4242 (idle): "MainThread"\n    wait (threading.py:320)\n',
    )
    return ProbeEvidence(
        directory="probes",
        captured_at=NOW,
        backend="iris",
        job_id="/ops/rl-job",
        commands=(ProbeCommand(argv=("iris", "job", "summary"), started_at=NOW, exit_code=0),),
        controller=ControllerView(job_id="/ops/rl-job", state="running", failure_count=2),
        attempts=(AttemptRecord(task_id="t0", attempt_id=0, state="failed", exit_code=1),),
        stacks=(stack,),
        gpus={"pod-0": ({"index": 0.0, "utilization_gpu_pct": 97.0, "power_draw_w": None},)},
        failures=("py-spy timed out on pod-1",),
    )


def _handmade() -> Evidence:
    logs = factories.logs(metrics=factories.metric_rows({"reward/avg_raw_reward": [0.1, 0.2]}))
    trials = factories.trials(
        [{"trial_name": "t1", "reward": 1.0, "n_turns": 3, "started_at": NOW}]
    )
    evidence = factories.evidence(log_tables=logs, trial_tables=trials, probes=_probes())
    return dataclasses.replace(
        evidence,
        now=NOW,
        thresholds=Thresholds(stall_floor_s=123),
        discrepancies=("refused path: trace_jobs/x -> /etc",),
        trials=dataclasses.replace(trials, sync_selection={"selected": 1}, unreadable=("a: b",)),
    )


def test_handmade_evidence_round_trips(tmp_path: Path) -> None:
    """Tables, probes, thresholds, mode, bundle and `now` (to the microsecond) come back equal."""
    evidence = _handmade()
    freeze(evidence, tmp_path)
    assert_same(thaw(tmp_path), evidence)


def test_collected_evidence_round_trips(tmp_path: Path) -> None:
    """Evidence the core read from a job directory thaws to an equal Evidence."""
    job_dir = write_job_bundle(tmp_path / "bundles")
    evidence = collect_evidence(job_dir, now=NOW)
    freeze(evidence, tmp_path / "frozen")
    thawed = thaw(tmp_path / "frozen")
    assert_same(thawed, evidence)
    assert thawed.logs is not None and thawed.logs.metrics.height > 0


def test_thawed_evidence_gets_the_same_verdict(tmp_path: Path) -> None:
    """Judging the thawed evidence gives the report the original evidence gets."""
    evidence = collect_evidence(write_job_bundle(tmp_path / "bundles"), now=NOW)
    freeze(evidence, tmp_path / "frozen")
    again = judge(thaw(tmp_path / "frozen"), event_id="e1")
    assert again.contract_dict() == judge(evidence, event_id="e1").contract_dict()


def test_absent_parts_stay_absent(tmp_path: Path) -> None:
    """Evidence without logs, trials or probes thaws without them."""
    evidence = factories.evidence()
    written = freeze(evidence, tmp_path)
    assert [path.name for path in written] == [MARKER]
    thawed = thaw(tmp_path)
    assert (thawed.logs, thawed.trials, thawed.probes) == (None, None, None)


def test_empty_tables_keep_their_schema(tmp_path: Path) -> None:
    """An empty table thaws with the columns and types it was frozen with."""
    evidence = factories.evidence(log_tables=LogTables(), trial_tables=TrialTables())
    freeze(evidence, tmp_path)
    assert_same(thaw(tmp_path), evidence)


def test_probe_files_follow_the_contract_layout(tmp_path: Path) -> None:
    """The frozen probes are readable as a recorded probe directory."""
    freeze(_handmade(), tmp_path)
    names = sorted(
        p.relative_to(tmp_path / "probes").as_posix()
        for p in (tmp_path / "probes").rglob("*")
        if p.is_file()
    )
    assert {"probes.json", "controller.json", "attempts.json"} <= set(names)
    assert "stacks/task-0-pid4242-1.txt" in names and "gpus/pod-0.csv" in names
    recorded = read_probes(tmp_path / "probes")
    assert recorded.controller is not None and recorded.controller.failure_count == 2
    assert recorded.stacks[0].pid == 4242


def test_marker_is_written_last(tmp_path: Path) -> None:
    """`evidence.json`, whose presence marks a whole freeze, is the last file written."""
    assert freeze(_handmade(), tmp_path)[-1].name == MARKER


def test_thaw_refuses_an_incomplete_directory(tmp_path: Path) -> None:
    """A directory without the marker is not frozen evidence."""
    with pytest.raises(FrozenEvidenceError):
        thaw(tmp_path)


# --- format 2: tables in content-addressed parts ------------------------------------------------


def _grown(evidence: Evidence, rows: int) -> Evidence:
    """`evidence` with `rows` more metric rows at the end of its metrics table."""
    assert evidence.logs is not None
    metrics = evidence.logs.metrics
    extra = metrics.tail(1).select(pl.all().repeat_by(rows).explode())
    extra = extra.with_columns(pl.col("step") + pl.int_range(1, rows + 1, dtype=pl.Int64))
    logs = dataclasses.replace(evidence.logs, metrics=pl.concat([metrics, extra]))
    return dataclasses.replace(evidence, logs=logs)


def _long(rows: int) -> Evidence:
    """Handmade evidence whose metrics table has `rows` rows."""
    values = {"reward/avg_raw_reward": [float(i % 7) for i in range(rows)]}
    logs = factories.logs(metrics=factories.metric_rows(values))
    return dataclasses.replace(_handmade(), logs=logs)


def _part_files(written: list[Path]) -> list[Path]:
    return [path for path in written if path.parent.name == PARTS]


def _stored(directories: list[Path]) -> dict[str, str]:
    """digest -> SHA-256 of every part written under the directories (what S3 would hold)."""
    found: dict[str, str] = {}
    for directory in directories:
        for path in (directory / PARTS).glob("*.parquet"):
            digest, sha = path.stem.split("-")
            found[digest] = sha
    return found


class _Shelf:
    """The parts of several freezes, as `fetch` finds them; counts what it is asked for."""

    def __init__(self, *directories: Path) -> None:
        self.directories = directories
        self.asked: list[str] = []

    def __call__(self, place: str, name: str) -> bytes:
        assert place == "shelf/"
        self.asked.append(name)
        for directory in self.directories:  # a freeze's directory, or a shelf of parts
            for path in (directory / PARTS / name, directory / name):
                if path.is_file():
                    return path.read_bytes()
        raise KeyError(name)


def test_a_table_is_cut_into_parts_of_part_rows(tmp_path: Path) -> None:
    """Just past PART_ROWS rows a table has two parts; at PART_ROWS, one."""
    for rows, parts in ((PART_ROWS, 1), (PART_ROWS + 1, 2)):
        freeze(_long(rows), tmp_path / str(rows))
        document = json.loads((tmp_path / str(rows) / MARKER).read_text())
        refs = document["logs"]["tables"]["metrics"]
        assert [ref[2] for ref in refs] == [PART_ROWS, rows - PART_ROWS][:parts]
        assert_same(thaw(tmp_path / str(rows)), _long(rows))


def test_a_grown_table_writes_only_its_new_parts(tmp_path: Path) -> None:
    """The freeze after growth, given the parts stored, writes the last part of the grown table
    only; the thaw through the earlier freeze's parts equals the grown evidence."""
    first, second = _long(PART_ROWS + 10), _grown(_long(PART_ROWS + 10), 500)
    written = freeze(first, tmp_path / "1", parts_at="shelf/")
    before = _stored([tmp_path / "1"])
    again = freeze(second, tmp_path / "2", parts_at="shelf/", stored=before)
    new = _part_files(again)
    assert len(new) == 1 and len(_part_files(written)) > 3
    document = json.loads((tmp_path / "2" / MARKER).read_text())
    metrics = document["logs"]["tables"]["metrics"]
    assert metrics[0][0] in before and new[0].name.startswith(metrics[-1][0])
    assert metrics[-1][2] == 510
    shelf = _Shelf(tmp_path / "1")
    assert_same(thaw(tmp_path / "2", fetch=shelf), second)
    assert shelf.asked and new[0].name not in shelf.asked  # its own part was read from disk


def test_a_changed_early_row_writes_its_part_again(tmp_path: Path) -> None:
    """A table whose early row changed, though it is as long as before, has that part written
    again (its digest changed); the unchanged part after it is referenced."""
    first = _long(PART_ROWS + 10)
    freeze(first, tmp_path / "1", parts_at="shelf/")
    assert first.logs is not None
    metrics = first.logs.metrics.with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(99.0).otherwise(pl.col("value")).alias("value")
    )
    second = dataclasses.replace(first, logs=dataclasses.replace(first.logs, metrics=metrics))
    stored = _stored([tmp_path / "1"])
    new = _part_files(freeze(second, tmp_path / "2", parts_at="shelf/", stored=stored))
    document = json.loads((tmp_path / "2" / MARKER).read_text())
    refs = document["logs"]["tables"]["metrics"]
    assert {path.name.split("-")[0] for path in new} == {refs[0][0]}
    assert refs[0][0] not in stored and refs[1][0] in stored
    assert_same(thaw(tmp_path / "2", fetch=_Shelf(tmp_path / "1")), second)


def test_a_rewritten_log_is_frozen_whole_and_a_grown_one_in_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real parser and its cache: a finelog that grew freezes only the parts after
    its unchanged rows; the same log rewritten (other lines first) freezes every part again."""
    monkeypatch.setattr(frozen, "PART_ROWS", 4)
    job_dir = write_job_bundle(tmp_path / "bundles", steps=40)
    log = job_dir / "finelog.log"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-6]))
    cache = LogCache(directory=tmp_path / "cache")
    written = freeze(collect_evidence(job_dir, now=NOW, log_cache=cache), tmp_path / "1")
    stored = _stored([tmp_path / "1"])
    with log.open("ab") as handle:
        handle.write(b"".join(lines[-6:]))
    grown = collect_evidence(job_dir, now=NOW, log_cache=cache)
    new = _part_files(freeze(grown, tmp_path / "2", parts_at="shelf/", stored=stored))
    assert 0 < len(new) < len(_part_files(written)) // 2
    assert_same(thaw(tmp_path / "2", fetch=_Shelf(tmp_path / "1")), grown)

    log.write_bytes(b"".join(lines[6:]) + b"".join(lines[:6]))  # rotated: other first lines
    rewritten = collect_evidence(job_dir, now=NOW, log_cache=cache)
    both = _stored([tmp_path / "1", tmp_path / "2"])
    new = _part_files(freeze(rewritten, tmp_path / "3", parts_at="shelf/", stored=both))
    document = json.loads((tmp_path / "3" / MARKER).read_text())
    metrics = document["logs"]["tables"]["metrics"]
    assert {ref[0] for ref in metrics} <= {path.name.split("-")[0] for path in new}
    assert_same(thaw(tmp_path / "3", fetch=_Shelf(tmp_path / "1")), rewritten)


def _shelve(directory: Path, shelf: Path) -> dict[str, str]:
    """Move the parts a freeze wrote to `shelf` (as the pipeline moves them to S3); returns
    what the shelf holds then."""
    shelf.mkdir(exist_ok=True)
    for path in (directory / PARTS).glob("*.parquet"):
        path.rename(shelf / path.name)
    return {path.stem.split("-")[0]: path.stem.split("-")[1] for path in shelf.iterdir()}


def test_a_part_cache_reads_only_the_new_parts(tmp_path: Path) -> None:
    """A process that thawed the first freeze thaws the grown one reading only its new part;
    without the cache it reads every part again."""
    first, second = _long(3 * PART_ROWS), _grown(_long(3 * PART_ROWS), 10)
    shelf_dir = tmp_path / "shelf"
    freeze(first, tmp_path / "1", parts_at="shelf/")
    stored = _shelve(tmp_path / "1", shelf_dir)
    freeze(second, tmp_path / "2", parts_at="shelf/", stored=stored)
    assert len(_shelve(tmp_path / "2", shelf_dir)) == len(stored) + 1
    shelf, cache = _Shelf(shelf_dir), PartCache(2**30)
    assert_same(thaw(tmp_path / "1", fetch=shelf, cache=cache), first)
    asked = len(shelf.asked)
    assert asked == len(stored)
    assert_same(thaw(tmp_path / "2", fetch=shelf, cache=cache), second)
    assert len(shelf.asked) == asked + 1
    assert_same(thaw(tmp_path / "2", fetch=shelf), second)
    assert len(shelf.asked) == 2 * asked + 2


def test_the_part_cache_is_bounded_by_bytes() -> None:
    """The least recently used parts go once the cache holds more than its bytes; a part larger
    than the whole cache is not kept."""
    frame = pl.DataFrame({"x": list(range(1000))})
    size = int(frame.estimated_size())
    cache = PartCache(2 * size)
    cache.put("a", frame)
    cache.put("b", frame)
    assert cache.get("a") is frame  # a is now the most recently used
    cache.put("c", frame)
    assert cache.get("b") is None and cache.get("a") is frame and cache.get("c") is frame
    assert cache.bytes == 2 * size
    small = PartCache(size - 1)
    small.put("a", frame)
    assert len(small) == 0


@pytest.mark.parametrize("damage", ["missing", "corrupt", "truncated", "other part"])
def test_a_damaged_part_is_a_frozen_evidence_error(tmp_path: Path, damage: str) -> None:
    """A referenced part that is gone, altered, cut or swapped for another never thaws into a
    shorter table: FrozenEvidenceError."""
    freeze(_long(PART_ROWS + 10), tmp_path / "1", parts_at="shelf/")
    stored = _shelve(tmp_path / "1", tmp_path / "shelf")
    document = json.loads((tmp_path / "1" / MARKER).read_text())
    last = tmp_path / "shelf" / PartRef(*document["logs"]["tables"]["metrics"][-1]).name
    other = tmp_path / "shelf" / PartRef(*document["logs"]["tables"]["metrics"][0]).name
    if damage == "missing":
        last.unlink()
    elif damage == "corrupt":
        body = bytearray(last.read_bytes())
        body[len(body) // 2] ^= 0xFF
        last.write_bytes(bytes(body))
    elif damage == "truncated":
        last.write_bytes(last.read_bytes()[:100])
    else:
        last.write_bytes(other.read_bytes())
    assert len(stored) > 2
    with pytest.raises(FrozenEvidenceError, match="part"):
        thaw(tmp_path / "1", fetch=_Shelf(tmp_path / "shelf"))


def test_parts_kept_elsewhere_need_a_fetch(tmp_path: Path) -> None:
    """A freeze whose parts are kept elsewhere does not thaw without a way to fetch them."""
    freeze(_long(10), tmp_path / "1", parts_at="shelf/")
    _shelve(tmp_path / "1", tmp_path / "shelf")
    with pytest.raises(FrozenEvidenceError, match="lacks its part"):
        thaw(tmp_path / "1")


def test_a_part_is_redacted_before_it_is_written(tmp_path: Path) -> None:
    """A token in a table never reaches a part file; the thawed table holds the redacted text."""
    token = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"
    evidence = _handmade()
    assert evidence.logs is not None
    errors = pl.DataFrame(
        {"text": [f"login failed with {token}"]}, schema_overrides={"text": pl.String}
    )
    errors = pl.concat([evidence.logs.errors, errors], how="diagonal_relaxed")
    leaky = dataclasses.replace(evidence, logs=dataclasses.replace(evidence.logs, errors=errors))
    written = freeze(leaky, tmp_path, parts_at="shelf/")
    assert not any(token.encode() in path.read_bytes() for path in written)
    thawed = thaw(tmp_path)
    assert thawed.logs is not None
    assert token not in str(thawed.logs.errors.get_column("text").to_list())


def as_format_1(directory: Path) -> None:
    """Rewrite a self-contained format-2 freeze in the layout format 1 wrote: one Parquet file a
    table under logs/ and trials/, no parts."""
    evidence = thaw(directory)
    document = json.loads((directory / MARKER).read_text())
    if evidence.logs is not None:
        for name in document["logs"].pop("tables"):
            (directory / "logs").mkdir(exist_ok=True)
            getattr(evidence.logs, name).write_parquet(directory / "logs" / f"{name}.parquet")
    if evidence.trials is not None:
        document["trials"].pop("parts")
        (directory / "trials").mkdir(exist_ok=True)
        evidence.trials.trials.write_parquet(directory / "trials" / "trials.parquet")
    del document["parts_at"]
    document["format"] = 1
    shutil.rmtree(directory / PARTS)
    (directory / MARKER).write_text(json.dumps(document))


def test_a_format_1_freeze_still_thaws_to_the_same_verdict(tmp_path: Path) -> None:
    """Evidence frozen before parts (format 1) thaws equal and is judged the same."""
    evidence = collect_evidence(write_job_bundle(tmp_path / "bundles"), now=NOW)
    freeze(evidence, tmp_path / "frozen")
    as_format_1(tmp_path / "frozen")
    assert not (tmp_path / "frozen" / PARTS).exists()
    thawed = thaw(tmp_path / "frozen")
    assert_same(thawed, evidence)
    again = judge(thawed, event_id="e1")
    assert again.contract_dict() == judge(evidence, event_id="e1").contract_dict()


def test_parts_redacted_under_older_rules_are_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rows under other redactor rules (`RULES_DIGEST`) have other digests: no stored
    part is reused, every part is written (and redacted) again; under the same rules, none."""
    first = _long(PART_ROWS + 10)
    written = _part_files(freeze(first, tmp_path / "1", parts_at="shelf/"))
    stored = _stored([tmp_path / "1"])
    assert _part_files(freeze(first, tmp_path / "2", parts_at="shelf/", stored=stored)) == []
    monkeypatch.setattr(frozen, "RULES_DIGEST", "0" * 16)
    again = _part_files(freeze(first, tmp_path / "3", parts_at="shelf/", stored=stored))
    assert len(again) == len(written)
    assert not {p.name.split("-")[0] for p in again} & set(stored)
    assert_same(thaw(tmp_path / "3"), first)


# --- the order of a freeze's work: rows hashed before `stored` is asked, parts written at once ---


class _AskedLate(dict[str, str]):
    """`stored` that notes how many tables had been hashed when it was first asked."""

    def __init__(self, parts: dict[str, str], hashed: list[str]) -> None:
        super().__init__(parts)
        self.hashed = hashed
        self.first_asked: int | None = None

    def _asked(self) -> None:
        if self.first_asked is None:
            self.first_asked = len(self.hashed)

    def __contains__(self, key: object) -> bool:
        self._asked()
        return super().__contains__(key)

    def __getitem__(self, key: str) -> str:
        self._asked()
        return super().__getitem__(key)


def test_stored_is_asked_only_once_every_table_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing of the stored parts (`StoredLater`) runs while the rows are hashed: the freeze
    asks `stored` nothing before the digests of every table, the trial table's included."""
    hashed: list[str] = []
    digests = frozen._digests

    def counted(name: str, frame: pl.DataFrame) -> list[str]:
        hashed.append(name)
        return digests(name, frame)

    monkeypatch.setattr(frozen, "_digests", counted)
    first = _long(PART_ROWS + 10)
    freeze(first, tmp_path / "1", parts_at="shelf/")
    tables = len(hashed)
    assert first.trials is not None and "trials" in hashed and tables > 2
    hashed.clear()
    stored = _AskedLate(_stored([tmp_path / "1"]), hashed)
    freeze(_grown(first, 5), tmp_path / "2", parts_at="shelf/", stored=stored)
    assert stored.first_asked == tables


def test_parts_are_listed_in_table_order(tmp_path: Path) -> None:
    """The files a freeze returns: every part in table order (each once), the marker last."""
    written = freeze(_long(2 * PART_ROWS + 10), tmp_path)
    document = json.loads((tmp_path / MARKER).read_text())
    tables = document["logs"]["tables"]
    refs = [ref for name in frozen._LOG_FRAMES for ref in tables[name]]
    refs += document["trials"]["parts"]
    order = list(dict.fromkeys(PartRef.from_json(ref).name for ref in refs))
    assert [p.name for p in _part_files(written)] == order
    assert written[-1].name == MARKER


def test_a_part_repeated_within_one_freeze_is_written_once(tmp_path: Path) -> None:
    """Two spans of one table with the same rows share a digest: one file, referenced twice."""
    base = _long(PART_ROWS)
    assert base.logs is not None
    twice = pl.concat([base.logs.metrics, base.logs.metrics])
    evidence = dataclasses.replace(base, logs=dataclasses.replace(base.logs, metrics=twice))
    written = _part_files(freeze(evidence, tmp_path))
    refs = json.loads((tmp_path / MARKER).read_text())["logs"]["tables"]["metrics"]
    assert len(refs) == 2 and refs[0] == refs[1]
    assert len(written) == len({p.name for p in written})
    assert_same(thaw(tmp_path), evidence)


class _Unlisted(dict[str, str]):
    def __contains__(self, key: object) -> bool:
        raise ConnectionError("the listing of the stored parts failed")


def test_a_failed_listing_fails_the_freeze_before_its_marker(tmp_path: Path) -> None:
    """What the listing raised reaches the caller; no marker says the freeze is whole."""
    with pytest.raises(ConnectionError, match="listing"):
        freeze(_long(10), tmp_path, parts_at="shelf/", stored=_Unlisted())
    assert not (tmp_path / MARKER).exists()


# --- the parts of a long table's tail -----------------------------------------------------------

_TAIL = PART_ROWS // 4  # the rule: a quarter part (frozen.TAIL_PARTS)


@pytest.mark.parametrize(
    ("rows", "lengths"),
    [
        (0, [0]),
        (PART_ROWS, [PART_ROWS]),
        (PART_ROWS + 1, [PART_ROWS, 1]),
        (PART_ROWS + _TAIL, [PART_ROWS, _TAIL]),
        (PART_ROWS + _TAIL + 1, [PART_ROWS, _TAIL, 1]),
        (2 * PART_ROWS - 1, [PART_ROWS, _TAIL, _TAIL, _TAIL, _TAIL - 1]),
        (2 * PART_ROWS, [PART_ROWS, PART_ROWS]),
        (2 * PART_ROWS + 1, [PART_ROWS, PART_ROWS, 1]),
    ],
)
def test_the_rows_after_the_last_full_part_are_cut_in_quarter_parts(
    rows: int, lengths: list[int]
) -> None:
    """A table of at most PART_ROWS rows is one part; a longer one has full parts, then parts of
    PART_ROWS // TAIL_PARTS rows; the spans cover every row once, in order."""
    spans = frozen._spans(rows)
    assert [length for _, length in spans] == lengths
    assert [start for start, _ in spans] == [sum(lengths[:i]) for i in range(len(lengths))]


@pytest.mark.parametrize(
    ("before", "grown_by", "written", "rows_written"),
    [
        # within the second tail part: that part alone
        (PART_ROWS + _TAIL + 10, 100, 1, 110),
        # across a tail part's end: it and the next
        (PART_ROWS + _TAIL - 10, 20, 2, _TAIL + 10),
        # across the full part's end: the full part (once) and the rest
        (2 * PART_ROWS - 10, 20, 2, PART_ROWS + 10),
    ],
)
def test_a_grown_long_table_rewrites_at_most_a_tail_part_of_its_earlier_rows(
    tmp_path: Path, before: int, grown_by: int, written: int, rows_written: int
) -> None:
    """Only the tail part the new rows fall in (and the ones after it) is written again: the
    full parts and the full tail parts before it are reused; the thaw equals the grown one."""
    first = _long(before)
    freeze(first, tmp_path / "1", parts_at="shelf/")
    second = _grown(first, grown_by)
    stored = _stored([tmp_path / "1"])
    new = _part_files(freeze(second, tmp_path / "2", parts_at="shelf/", stored=stored))
    assert len(new) == written
    refs = json.loads((tmp_path / "2" / MARKER).read_text())["logs"]["tables"]["metrics"]
    assert sum(ref[2] for ref in refs if ref[0] not in stored) == rows_written
    assert_same(thaw(tmp_path / "2", fetch=_Shelf(tmp_path / "1")), second)
