"""A toy trainer that completes a few steps, hangs inside `all_reduce` until the file named by its
first argument appears, then resumes stepping (a slow collective that comes back)."""

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

RESUME = Path(sys.argv[1])


def log(message: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    print(f"{stamp} | INFO | skyrl_train.trainer:train:210 - {message}", flush=True)


def all_reduce() -> None:
    while not RESUME.exists():
        time.sleep(0.2)


def train_step() -> None:
    time.sleep(0.5)


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
