"""A toy trainer printing SkyRL-format phase timers and WANDB_MIRROR metric records."""

import json
import sys
import time
from datetime import UTC, datetime

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def log(message: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    print(f"{stamp} | INFO | skyrl_train.trainer:train:210 - {message}", flush=True)


for step in range(1, STEPS + 1):
    log("Started: 'step'")
    time.sleep(0.3)
    log("Finished: 'step', time cost: 1.00s")
    metrics = {"reward/avg_raw_reward": 0.1 * step, "policy/policy_entropy": 1.0}
    print(f"WANDB_MIRROR kind=train step={step} metrics={json.dumps(metrics)}", flush=True)
