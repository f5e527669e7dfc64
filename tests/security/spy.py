"""A spy in place of a cluster tool (run by the wrappers `spies.make_spybin` writes).

It appends its argv (tool name first) as one JSON line to `$SPY_LOG`, then answers with the first
reply of `$SPY_REPLIES` (a JSON list of `[regex, {"stdout", "exit"}]`) whose regex is found in the
command line `<tool> <args joined by spaces>`; without one it exits 1. Standard library only.
"""

import json
import os
import re
import sys
from pathlib import Path

tool = Path(sys.argv[1]).name
args = sys.argv[2:]
with Path(os.environ["SPY_LOG"]).open("a", encoding="utf-8") as log:
    log.write(json.dumps([tool, *args]) + "\n")
line = " ".join([tool, *args])
replies = json.loads(Path(os.environ["SPY_REPLIES"]).read_text(encoding="utf-8"))
for pattern, reply in replies:
    if re.search(pattern, line):
        sys.stdout.write(reply.get("stdout", ""))
        sys.exit(int(reply.get("exit", 0)))
print(f"spy: no reply for {line!r}", file=sys.stderr)
sys.exit(1)
