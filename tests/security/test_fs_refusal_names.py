"""Issue 28, a low item: a refusal named where the refused symlink points.

A bundle's author chooses a symlink's target, so a refusal that printed where it points told them
about the machine that read it (`/proc/self/fd/N` became the terminal or a pipe; a link to `.` the
worker's working directory; a link to the interpreter its install path). Now a refusal names the
path as the bundle gives it, and the job directory as the operator gave it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner

from worker.cli import main


def test_a_refusal_names_the_link_not_its_target(tmp_path: Path) -> None:
    """Links out of the job directory to a descriptor, the working directory and the
    interpreter are refused by their names in the job; no target is printed."""
    job = tmp_path / "job"
    (job / "pod_logs").mkdir(parents=True)
    (job / "finelog.log").symlink_to("/proc/self/fd/1")
    (job / "pod_logs" / "rank-0.log").symlink_to(sys.executable)
    (job / "ray_vllm_logs").symlink_to(Path.cwd(), target_is_directory=True)
    result = CliRunner().invoke(main, ["parse", str(job), "--out", str(tmp_path / "out")])
    printed = result.output + result.stderr
    assert "refused 'finelog.log'" in printed
    assert "refused 'pod_logs/rank-0.log'" in printed
    assert "refused 'ray_vllm_logs'" in printed
    targets = ["/proc/", "/dev/", "pipe:", str(Path.cwd()), str(Path(sys.executable).resolve())]
    assert not [target for target in targets if target in printed], printed
