"""The `rl-health` command line.

Commands are imported only when invoked, so `rl-health parse` does not pay for Celery or boto3.
Each command lives in its own module of this package and is named in `COMMANDS`.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

import click

__all__ = ["COMMANDS", "main"]

COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "parse": ("worker.cli.parse_cmd", "Extract metric, phase, engine, trial and error tables."),
    "diagnose": ("worker.cli.diagnose_cmd", "Diagnose one job directory: KILL, NO-KILL or ERROR."),
    "eval": (
        "worker.cli.eval_cmd",
        "Score the verdict rules on a folder of labelled bundles (case.json each).",
    ),
    "alert": ("worker.cli.pipeline_cmd", "Publish a suspect-job event (the watcher side)."),
    "ingest": (
        "worker.cli.pipeline_cmd",
        "Consume alerts and start one diagnosis per job in need.",
    ),
    "worker": ("worker.cli.pipeline_cmd", "Start a Celery worker."),
    "verdicts": ("worker.cli.pipeline_cmd", "Read verdicts (the supervisor side)."),
    "replay": ("worker.cli.pipeline_cmd", "Re-diagnose an archived event."),
    "sweep": (
        "worker.cli.sweep_cmd",
        "Delete frozen evidence older than --keep and table parts no kept evidence uses.",
    ),
    "board": ("worker.cli.board_cmd", "Serve a read-only web page of recent verdicts."),
    "signatures": (
        "worker.cli.signatures_cmd",
        "Show which log lines matched which failure catalogue entry or signature.",
    ),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[cmd_name][0])
        command: Any = getattr(module, f"{cmd_name}_command")
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rl-job-health")
def main() -> None:
    """rl-job-health: evidence-backed KILL / NO-KILL / ERROR verdicts for suspect RL jobs.

    Read-only by construction: it never kills, restarts or edits a job.
    """
    from shared.redact import install_log_redaction

    install_log_redaction()  # every log message of every command is redacted and escaped
