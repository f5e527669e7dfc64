"""Fails its first attempt on a transient (a marker file records it), then trains and finishes."""

import sys
import time
from pathlib import Path

marker = Path(sys.argv[1])
if not marker.exists():
    marker.write_text("first attempt seen\n")
    print("RuntimeError: NCCL error: unhandled system error", file=sys.stderr, flush=True)
    sys.exit(1)
print("Resuming from global_step: 1", flush=True)
for step in range(2, 4):
    print(f"Finished: 'step', time cost: 0.50s (step {step})", flush=True)
    time.sleep(0.5)
