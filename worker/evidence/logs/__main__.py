"""`python -m worker.evidence.logs PATH [...]` is `rl-health parse PATH [...]`: one parse command.

A second command beside it once printed what the redactor hides (issue 28); there is one now, with
its redaction, its checked `--out` and its exit codes (`worker.cli.parse_cmd`).
"""

from __future__ import annotations

from worker.cli.parse_cmd import parse_command

if __name__ == "__main__":
    parse_command(prog_name="python -m worker.evidence.logs")
