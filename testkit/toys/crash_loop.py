"""A trainer that dies the same way on every attempt: a step starts, then CUDA runs out."""

import sys
import time
from datetime import UTC, datetime

stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
print(f"{stamp} | INFO | skyrl_train.trainer:train:210 - Started: 'step'", flush=True)
time.sleep(0.5)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.63 GiB", file=sys.stderr)
sys.exit(3)
