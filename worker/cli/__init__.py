"""The `rl-health` command line.

Commands are imported only when invoked, so `rl-health parse` does not pay for Celery or boto3.
Each command lives in its own module of this package and is named in `COMMANDS`.
"""

from __future__ import annotations

import importlib
import os
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
    "check": (
        "worker.cli.check_cmd",
        "Check that Redis, S3 and the verdict key are usable (--wait: until they are).",
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

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a dependency failing in it (Redis, S3, credentials) is one line and
        exit 2 (`worker.cli.dependencies`), unless --debug asks for the traceback."""
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except Exception as exc:
            _raise_dependency_error(exc)
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _raise_dependency_error(exc: Exception) -> None:
    """Raise `DependencyError` for a dependency failure (nothing when --debug is on: the caller
    re-raises with the whole traceback)."""
    from worker.cli.dependencies import DependencyError, dependency_failure
    from worker.cli.options import debugging

    if debugging():
        return
    try:
        from shared.settings import Settings

        settings: Settings | None = Settings()
    except Exception:  # the settings were refused earlier, or cannot be read: name no address
        settings = None
    message = dependency_failure(exc, settings)
    if message is not None:
        raise DependencyError(message) from exc


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rl-job-health")
@click.option(
    "--debug",
    is_flag=True,
    help="Show the traceback behind an error line (also RLHEALTH_DEBUG=1) and log at DEBUG.",
)
def main(debug: bool) -> None:
    """rl-job-health: evidence-backed KILL / NO-KILL / ERROR verdicts for suspect RL jobs.

    Read-only by construction: it never kills, restarts or edits a job.
    """
    from shared.redact import install_log_redaction
    from worker.cli.options import DEBUG_ENV

    if debug:
        os.environ[DEBUG_ENV] = "1"  # read by every command and the processes they start
    install_log_redaction()  # every log message of every command is redacted and escaped
