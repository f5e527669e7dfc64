"""The README's quick start, run line by line as a new on-call engineer would, against real
services (redis-server, moto's S3 server, a prefork worker, ingest): the alert prints its verdict
every time — three alerts in a row, the first racing a worker that is still starting — and
`verdicts --event` finds it again.

The lines are the README's own (between `<!-- quickstart -->` markers), changed only where a test
must: the ports (free ones, not 6379 and 5000), `.venv/bin/` (this interpreter's), and each
background job's pid written down so the test stops exactly the processes it started.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.services import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
VERDICT = re.compile(
    r"^\S+Z\s+KILL\s+high\s+/ops/rl-gsm8k-stalled\s+(evt-\S+)(?: \(\+\d+ coalesced\))?\s+s3://",
    re.MULTILINE,
)
ALERTS = 3


def quickstart_lines() -> list[str]:
    """The commands of the README's quick start, in order."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- quickstart -->", 1)[1].split("<!-- /quickstart -->", 1)[0]
    body = block.strip().removeprefix("```").removesuffix("```")
    return [line.strip() for line in body.strip().splitlines() if line.strip()]


def test_the_quick_start_has_the_commands_the_issue_asks_for() -> None:
    """Services, the readiness check, worker, ingest, and an alert that waits for its verdict."""
    lines = quickstart_lines()
    assert lines[0].startswith("redis-server ") and lines[-1].startswith(
        ".venv/bin/rl-health alert "
    )
    assert " --wait " in lines[-1] and any(" check --wait " in line for line in lines)


def _script(lines: list[str], pids: Path) -> str:
    """The quick start as a bash script: ports and the venv replaced, background pids written
    down, the last line (the alert) run ALERTS times, then `verdicts --event` for each."""
    redis_port, s3_port = free_port(), free_port()
    out = ["set -e"]
    for number, given in enumerate(lines, 1):
        line = given.replace("6379", str(redis_port)).replace(":5000", f":{s3_port}")
        line = line.replace("-p 5000", f"-p {s3_port}").replace(".venv/bin/", f"{BIN}/")
        last = number == len(lines)
        for _ in range(ALERTS if last else 1):
            out.append(f"echo '### line {number}'")
            out.append(f"{line} | tee -a alerts.out" if last else line)
            if line.endswith("&"):
                out.append(f"echo $! >> {pids}")
    out.append("echo '### again'")
    each = f"{BIN}/rl-health verdicts --event $id"
    out.append(f"for id in $(grep -o '^evt-[^ ]*' alerts.out); do {each}; done")
    return "\n".join(out) + "\n"


def _stop(pids: Path) -> None:
    """SIGTERM to each background job the script started, the last started first (ingest and
    the worker before the services they use)."""
    if not pids.exists():
        return
    for raw in reversed(pids.read_text().split()):
        try:
            os.kill(int(raw), signal.SIGTERM)
        except ProcessLookupError:
            continue


def test_the_readme_quick_start_prints_the_verdict_every_time(tmp_path: Path) -> None:
    """Run in order on a clean folder: each of three alerts prints its event id then a KILL
    verdict line (exit 0, no error line), and `verdicts --event` prints the verdict of each."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    pids = tmp_path / "pids"
    script = _script(quickstart_lines(), pids)
    keep = ("PATH", "HOME", "PYTHONPATH", "LANG", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env["RLHEALTH_CACHE_DIR"] = str(tmp_path / "cache")
    out, err = tmp_path / "script.out", tmp_path / "script.err"
    try:  # into files: the background services keep a pipe open after the script ends
        with out.open("w") as stdout, err.open("w") as stderr:
            done = subprocess.run(
                ["bash", "-c", "set -o pipefail\n" + script],
                cwd=tmp_path,
                env=env,
                stdout=stdout,
                stderr=stderr,
                timeout=280,
                check=False,
            )
    finally:
        _stop(pids)
    stdout_text, stderr_text = out.read_text(), err.read_text()
    logs = "".join(
        f"\n--- {name}\n{(tmp_path / name).read_text()[-3000:]}"
        for name in ("worker.log", "ingest.log")
        if (tmp_path / name).exists()
    )
    assert done.returncode == 0, stdout_text[-3000:] + stderr_text[-3000:] + logs
    answered = (tmp_path / "alerts.out").read_text()
    events = re.findall(r"^(evt-\S+)$", answered, re.MULTILINE)
    verdicts = VERDICT.findall(answered)
    assert len(events) == ALERTS and len(verdicts) == ALERTS, answered
    again = VERDICT.findall(stdout_text.split("### again")[-1])
    assert len(again) == ALERTS, stdout_text[-3000:]
    assert "verdict event=" in (tmp_path / "worker.log").read_text()
