"""The board: recent verdicts from the stream, newest first, filterable, linking to the stored
reports; GET only, no form, every piece of text escaped."""

from __future__ import annotations

import json
import warnings
from typing import Any

import fakeredis
import pytest

with warnings.catch_warnings():  # starlette asks for httpx2 over httpx; both drive the app alike
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from reports.html import CSP
from shared.signing import sign
from testkit.keys import TEST_KEYS, signed_fields
from worker.pipeline.board import Board, make_board, mechanism_of, report_key_of
from worker.pipeline.store import MemoryStore

STREAM = "rlhtest:verdicts"


def _gates(**statuses: tuple[str, str]) -> dict[str, Any]:
    names = ("liveness", "resources", "rollouts", "dynamics", "duty_cycle")
    gates = {name: {"status": "PASS", "summary": "fine", "evidence": []} for name in names}
    for name, (status, summary) in statuses.items():
        gates[name] = {"status": status, "summary": summary, "evidence": []}
    return gates


def _publish(
    client: Any,
    store: MemoryStore,
    *,
    lead: str,
    ids: list[str],
    verdict: str,
    cluster: str = "cw",
    job: str = "rl-job",
    document: dict[str, Any] | None = None,
) -> str:
    key = f"reports/{cluster}/ops/{job}/2026-07-30T21:15:00Z-{lead}.json"
    body = document or {"verdict": verdict, "gates": _gates(), "kill_proof": None}
    store.put_once(key, json.dumps(sign(body, TEST_KEYS)).encode())
    store.put_once(key.removesuffix(".json") + ".html", b"<!DOCTYPE html><p>report</p>")
    client.xadd(
        STREAM,
        signed_fields(
            {
                "event_id": lead,
                "event_ids": ids,
                "job_id": f"/ops/{job}",
                "verdict": verdict,
                "confidence": "high",
                "report_uri": store.uri(key),
                "captured_at": "2026-07-30T21:15:00Z",
            }
        ),
    )
    return key


@pytest.fixture
def setup() -> tuple[TestClient, Any, MemoryStore]:
    client = fakeredis.FakeRedis()
    store = MemoryStore()
    board = Board(client, store, STREAM, keys=TEST_KEYS, limit=50, refresh_s=15)
    return TestClient(make_board(board)), client, store


def test_verdicts_are_listed_newest_first_with_every_event_id(
    setup: tuple[TestClient, Any, MemoryStore],
) -> None:
    """Two verdicts appear newest first; a re-announcement shows once, with every event id."""
    http, redis, store = setup
    _publish(redis, store, lead="e-old", ids=["e-old"], verdict="NO-KILL", job="calm")
    _publish(redis, store, lead="e-new", ids=["e-new"], verdict="KILL", job="busy")
    _publish(redis, store, lead="e-new", ids=["e-new", "e-late"], verdict="KILL", job="busy")
    page = http.get("/").text
    assert page.index("/ops/busy") < page.index("/ops/calm")
    assert page.count("/ops/busy</td>") + page.count("/ops/busy<br>") == 1
    assert "e-new<br>e-late" in page
    assert '<span class="v v-KILL">KILL</span>' in page
    assert '<meta http-equiv="refresh" content="15">' in page


def test_each_verdict_links_to_its_html_report_served_through_the_board(
    setup: tuple[TestClient, Any, MemoryStore],
) -> None:
    """The row links to /report/<key>.html, which serves the stored page with a strict CSP."""
    http, redis, store = setup
    key = _publish(redis, store, lead="e1", ids=["e1"], verdict="KILL")
    html_link = "/report/" + key.removesuffix(".json") + ".html"
    assert f'href="{html_link}"' in http.get("/").text
    response = http.get(html_link)
    assert response.status_code == 200 and response.text == "<!DOCTYPE html><p>report</p>"
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["content-security-policy"] == CSP
    assert http.get("/report/" + key).headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    "path",
    [
        "/report/events/e1.json",
        "/report/evidence/e1/evidence.json",
        "/report/reports/cw/ops/../../events/e1.json",
        "/report/reports/cw/ops/rl-job/x.py",
        "/report/reports/cw/ops/x.html",
    ],
)
def test_only_report_keys_are_served(setup: tuple[TestClient, Any, MemoryStore], path: str) -> None:
    """Events, frozen evidence, parent segments and other shapes are refused with 404."""
    http, _redis, store = setup
    store.put_once("events/e1.json", b"{}")
    store.put_once("evidence/e1/evidence.json", b"{}")
    assert http.get(path).status_code == 404


def test_a_missing_report_is_a_readable_404(setup: tuple[TestClient, Any, MemoryStore]) -> None:
    """A verdict stored before HTML reports existed gets a 404 page saying so."""
    http, _redis, _store = setup
    response = http.get("/report/reports/cw/ops/rl-job/2026-07-30T21:15:00Z-old.html")
    assert response.status_code == 404 and "stored before HTML reports existed" in response.text


def test_filters_by_cluster_and_verdict(setup: tuple[TestClient, Any, MemoryStore]) -> None:
    """?cluster= and ?verdict= narrow the table; an unknown verdict filter shows everything."""
    http, redis, store = setup
    _publish(redis, store, lead="a", ids=["a"], verdict="KILL", cluster="cw", job="ja")
    _publish(redis, store, lead="b", ids=["b"], verdict="NO-KILL", cluster="gcp", job="jb")
    _publish(redis, store, lead="c", ids=["c"], verdict="ERROR", cluster="cw", job="jc")
    cw = http.get("/", params={"cluster": "cw"}).text
    assert "/ops/ja" in cw and "/ops/jc" in cw and "/ops/jb" not in cw
    errors = http.get("/", params={"cluster": "cw", "verdict": "ERROR"}).text
    assert "/ops/jc" in errors and "/ops/ja" not in errors
    assert "1 of 3 recent verdicts" in errors
    everything = http.get("/", params={"verdict": "MAYBE"}).text
    assert all(f"/ops/{job}" in everything for job in ("ja", "jb", "jc"))
    assert '<a href="/?cluster=gcp">gcp</a>' in everything


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
@pytest.mark.parametrize("path", ["/", "/report/reports/cw/ops/rl-job/x-e1.html", "/healthz"])
def test_every_route_refuses_anything_but_get(
    setup: tuple[TestClient, Any, MemoryStore], method: str, path: str
) -> None:
    """The board is read-only: other methods get 405 and change nothing."""
    http, redis, store = setup
    _publish(redis, store, lead="e1", ids=["e1"], verdict="KILL")
    before = (redis.xlen(STREAM), dict(store.objects))
    assert http.request(method, path).status_code == 405
    assert (redis.xlen(STREAM), dict(store.objects)) == before
    assert http.head("/").status_code == 200


def test_the_page_offers_no_action_and_escapes_what_it_shows(
    setup: tuple[TestClient, Any, MemoryStore],
) -> None:
    """No form, button or script; a hostile job id and gate summary come out as text."""
    http, redis, store = setup
    hostile = "<script>alert(1)</script>"
    document = {"verdict": "ERROR", "gates": _gates(liveness=("ERROR", hostile))}
    _publish(redis, store, lead="e1", ids=["e1"], verdict="ERROR", job="x", document=document)
    fields = {**_fields(redis), "job_id": hostile, "event_id": "e2"}
    redis.xadd(STREAM, signed_fields({**fields, "event_ids": json.loads(fields["event_ids"])}))
    page = http.get("/").text.lower()
    assert "<form" not in page and "<button" not in page and "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def _fields(redis: Any) -> dict[str, str]:
    ((_id, fields),) = redis.xrevrange(STREAM, count=1)
    return {k.decode(): v.decode() for k, v in fields.items()}


def test_the_stream_unavailable_is_a_503_page(setup: tuple[TestClient, Any, MemoryStore]) -> None:
    """With Redis away the board answers 503 saying so, and keeps serving."""
    _http, _redis, store = setup

    class Down:
        def xrevrange(self, *args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("Connection refused")

    http = TestClient(make_board(Board(Down(), store, STREAM, keys=TEST_KEYS)))
    response = http.get("/")
    assert response.status_code == 503 and "verdict stream is unavailable" in response.text
    assert http.get("/healthz").text == "ok"


def test_mechanism_comes_from_the_kill_proof_else_the_deciding_gate() -> None:
    """kill_proof.mechanism wins; an ERROR verdict names its first ERROR gate, others a FAIL."""
    proof = {
        "verdict": "KILL",
        "kill_proof": {"mechanism": "wedged in all_reduce"},
        "gates": _gates(liveness=("FAIL", "stalled")),
    }
    assert mechanism_of(proof) == "wedged in all_reduce"
    mixed = _gates(dynamics=("FAIL", "reward collapsed"), rollouts=("ERROR", "no trials"))
    assert mechanism_of({"verdict": "ERROR", "gates": mixed}) == "rollouts: no trials"
    assert mechanism_of({"verdict": "NO-KILL", "gates": mixed}) == "dynamics: reward collapsed"
    assert mechanism_of({"verdict": "NO-KILL", "gates": _gates()}) == "-"
    assert mechanism_of({}) == "-"
    long = mechanism_of({"verdict": "ERROR", "gates": _gates(liveness=("ERROR", "x" * 500))})
    assert len(long) == 160 and long.endswith("…")


def test_report_key_of_accepts_only_keys_of_this_store() -> None:
    """A report URI of another bucket or outside reports/ gives no link."""
    store = MemoryStore(bucket="b", prefix="ci")
    good = store.uri("reports/cw/ops/j/t-e.json")
    assert report_key_of(good, store.uri("")) == "reports/cw/ops/j/t-e.json"
    assert report_key_of("s3://other/ci/reports/cw/ops/j/t-e.json", store.uri("")) is None
    assert report_key_of(store.uri("events/e.json"), store.uri("")) is None
