"""`rl-health board`: serve the read-only board of recent verdicts (worker/pipeline/board.py).

Connections come from settings (RLHEALTH_REDIS_URL, RLHEALTH_S3_*, RLHEALTH_STREAM_PREFIX), like
every pipeline command; the verdict key (RLHEALTH_VERDICT_KEY or _FILE) verifies what it shows.
"""

from __future__ import annotations

import click

from worker.cli.options import load_settings, load_verdict_keys

__all__ = ["board_command"]


@click.command("board")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, show_default=True, help="Verdicts shown."
)
@click.option(
    "--refresh",
    type=click.IntRange(min=2),
    default=15,
    show_default=True,
    help="Seconds between the page's own refreshes.",
)
def board_command(host: str, port: int, limit: int, refresh: int) -> None:
    """Serve a read-only web page of recent verdicts, each linking to its HTML report.

    GET only: it lists verdicts and serves stored reports, and offers no action on any job.
    Only verdicts signed with the verdict key are shown as verdicts; other entries are marked
    REFUSED.
    """
    import uvicorn

    from shared.streams import StreamNames
    from worker.cli.dependencies import reach_redis, reach_s3
    from worker.pipeline.board import Board, make_board

    settings = load_settings()  # exit 2 with one line for an unusable setting
    keys = load_verdict_keys(settings)
    client = reach_redis(settings)  # Redis and S3 reached first: exit 2 with one line if not
    store = reach_s3(settings)
    stream = StreamNames(settings.stream_prefix).verdicts
    board = Board(client, store, stream, keys=keys, limit=limit, refresh_s=refresh)
    click.echo(f"rl-health board on http://{host}:{port}/ (read-only)", err=True)
    uvicorn.run(make_board(board), host=host, port=port, log_level="warning", access_log=False)
