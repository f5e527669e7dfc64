"""A toy trainer that completes a few steps, then hangs forever inside `all_reduce`.

An optional argument sets how many ranks hang (default 1): the others are forked after the steps
and stop when the first rank is gone.
"""

import os
import sys
import time
from datetime import UTC, datetime


def log(message: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    print(f"{stamp} | INFO | skyrl_train.trainer:train:210 - {message}", flush=True)


def all_reduce(first_rank: int) -> None:
    while True:
        time.sleep(1)
        if first_rank and os.getppid() != first_rank:  # the first rank is gone: so is this one
            sys.exit(0)


ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for _ in range(2):
    log("Started: 'step'")
    time.sleep(0.2)
    log("Finished: 'step', time cost: 0.20s")
log("Started: 'step'")
log("Started: 'policy_train'")
first = os.getpid()
for _ in range(ranks - 1):
    if os.fork() == 0:
        all_reduce(first)
all_reduce(0)
