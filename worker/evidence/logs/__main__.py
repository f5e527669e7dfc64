"""`python -m worker.evidence.logs PATH [...]` is `rl-health parse PATH [...]`."""

from __future__ import annotations

from worker.cli.parse_cmd import parse_command

if __name__ == "__main__":
    parse_command(prog_name="python -m worker.evidence.logs")
