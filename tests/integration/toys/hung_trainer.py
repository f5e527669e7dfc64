"""A toy trainer that completes a few steps, then hangs forever inside `all_reduce`."""

import time
from datetime import UTC, datetime


def log(message: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    print(f"{stamp} | INFO | skyrl_train.trainer:train:210 - {message}", flush=True)


def all_reduce() -> None:
    while True:
        time.sleep(1)


for _ in range(2):
    log("Started: 'step'")
    time.sleep(0.2)
    log("Finished: 'step', time cost: 0.20s")
log("Started: 'step'")
log("Started: 'policy_train'")
all_reduce()
