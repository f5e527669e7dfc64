"""A toy trainer on a toy Ray node: it starts two helpers that look like Ray's own, completes a few
steps, then waits inside `all_reduce`; with an argument, it resumes stepping once the file that
argument names appears (a slow collective that comes back).

The helpers are real Python processes whose scripts sit where Ray keeps its log monitor and its
dashboard agent (under `ray/_private/` and `ray/dashboard/` of a scratch directory), so `ps` and
`py-spy` show them the way a Ray node's show: the log monitor changes frames every second (its
stack grows by one frame a second, so no two dumps a second apart agree), the agent runs an
asyncio loop whose frames move between `select` and its periodic task. Both exit when the trainer
is gone.

The LocalCluster runs a toy as `python -c <this source>`, so its command line is this text: the
helpers' paths are built from pieces here, or the trainer's own command line would name a helper.
"""

import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

RESUME = Path(sys.argv[1]) if len(sys.argv) > 1 else None

LOG_MONITOR = """
import os, sys, time
sys.setrecursionlimit(10000)
parent = os.getppid()

def check_log_files_and_publish_updates(depth):
    time.sleep(1)
    if os.getppid() == parent and depth < 3000:
        check_log_files_and_publish_updates(depth + 1)

while os.getppid() == parent:
    check_log_files_and_publish_updates(0)
"""

AGENT = """
import asyncio, os

async def report_usage(parent):
    while os.getppid() == parent:
        sum(range(20000))
        await asyncio.sleep(0.2)

async def main():
    await report_usage(os.getppid())

asyncio.run(main())
"""


def log(message: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    print(f"{stamp} | INFO | skyrl_train.trainer:train:210 - {message}", flush=True)


def start_helpers() -> list[subprocess.Popen[bytes]]:
    """Ray's log monitor and dashboard agent, as scripts at the paths of Ray's own."""
    root = Path(tempfile.mkdtemp(prefix="ray_node_trainer-"))
    started = []
    for parts, source, args in (
        (("ray", "_private", "log_monitor"), LOG_MONITOR, ["--session-dir=/tmp/ray/session_x"]),
        (("ray", "dashboard", "agent"), AGENT, ["--node-ip-address=127.0.0.1"]),
    ):
        script = root.joinpath(*parts).with_suffix(".py")
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(source)
        started.append(subprocess.Popen([sys.executable, "-u", str(script), *args]))
    return started


def all_reduce() -> None:
    while RESUME is None or not RESUME.exists():
        time.sleep(0.2)


def train_step() -> None:
    time.sleep(0.5)


helpers = start_helpers()
for _ in range(2):
    log("Started: 'step'")
    time.sleep(0.2)
    log("Finished: 'step', time cost: 0.20s")
log("Started: 'step'")
log("Started: 'policy_train'")
all_reduce()
log("Finished: 'policy_train', time cost: 1.00s")
log("Finished: 'step', time cost: 1.00s")
while True:
    log("Started: 'step'")
    train_step()
    log("Finished: 'step', time cost: 0.50s")
