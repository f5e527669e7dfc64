"""Run the native pass over random and crafted inputs, for a build under AddressSanitizer/UBSan.

    SO=worker/evidence/logs/_fastscan.cpython-311-x86_64-linux-gnu.so; cp $SO /tmp/fastscan.so
    gcc -shared -fPIC -O1 -g -std=gnu11 -fsanitize=address,undefined \\
        -fno-sanitize-recover=undefined -I$(python -c "import sysconfig; \\
        print(sysconfig.get_paths()['include'])") worker/evidence/logs/_fastscan.c -o $SO
    ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$(gcc -print-file-name=libasan.so) \\
        $(gcc -print-file-name=libubsan.so)" .venv/bin/python bench/asan_fastscan.py
    cp /tmp/fastscan.so $SO   # (or `python setup.py build_ext --inplace`)

Stat lines, lines of the kinds the pass reads natively (`rules.NATIVE_KINDS`: Iris and Ray
prefixes, colour codes, loguru headers, cut at any byte, a colour code cut at the line's or the
buffer's end), noise, NUL, CR, invalid UTF-8, every flag literal (whole or truncated) in random
order, at random `end`s, with rules that keep few lines (so the drop runs) and with the parser's
own; every literal at the very end of a buffer at 70 offsets (the vector loads stop short of
`end`); an 8 MiB read of the continuous log through the whole scan. A sanitizer report aborts.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.bench_parse import log_path  # noqa: E402
from worker.evidence.logs import native, rules  # noqa: E402
from worker.evidence.logs.reads import Read  # noqa: E402
from worker.evidence.logs.rules import KEEP  # noqa: E402
from worker.evidence.logs.scan import scan  # noqa: E402

STAT = (
    b"[21:00:04] task=/ops/rl-bench/0 | (EngineCore_DP0 pid=28723, ip=10.0.0.3) "
    b"INFO 03-26 21:00:04 [loggers.py:123] Engine 000: Avg prompt throughput: 512.3 tokens/s, "
    b"Avg generation throughput: 1024.0 tokens/s, Running: 24 reqs, Waiting: 2 reqs, "
    b"GPU KV cache usage: 72.4%, Prefix cache hit rate: 28.5%"
)


def _kind_lines() -> list[bytes]:
    """Lines of each kind the pass reads natively, and colour codes cut short."""
    prefix = b"[21:00:05] task=/ops/rl-bench/0 | \x1b[36m(skyrl_entrypoint pid=8455, ip=h)\x1b[0m "
    loguru = b"2026-03-26 21:00:05.123 | INFO     | skyrl.train.trainer:train:210 - "
    kinds = [prefix + loguru + lit.encode() + b"x'" for lit, _ in rules.NATIVE_KINDS]
    kinds += [prefix + lit.encode() + b" 1 / 9" for lit, _ in rules.NATIVE_KINDS]
    # pid, ip and rank inside a task near the line limit: the actor is longer than the line
    task = b"/pid=" + b"1" * 1300 + b"/ip=" + b"a" * 1300 + b"/[rank" + b"2" * 1290 + b"]"
    kinds.append(b"[21:00:05] task=" + task + b" | Started: 'x'")
    return [*kinds, prefix + loguru + b"Started: 'x' \x1b[", prefix + b"\x1b[3", b"\x1b"]


def main() -> None:
    rng = random.Random(5)
    literals = [lit.encode() for lit in rules.FLAG_LITERALS]
    few = native.rules(rules.FLAG_LITERALS, rules.BLOCK_STARTS, 3, 1, 64)
    kinds = _kind_lines()
    pieces = [STAT, b"noise line", b"", b"\x00", b"\r", b"\xff\xfe", "é█".encode(), *literals]
    pieces += kinds
    first = b"noise\n" * KEEP.first_lines
    dropped = 0
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(0, 40)):
            piece = rng.choice(pieces)
            if rng.random() < 0.3:
                piece = piece[: rng.randint(0, len(piece))]
            parts.append(piece + (b"\n" if rng.random() < 0.8 else b""))
        data = b"".join(parts) + bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))
        late = first + data  # past the first lines: the native kinds are read
        for end in {len(data), rng.randint(0, len(data))}:
            runs = ((data, end, few), (data, end, KEEP), (late, len(first) + end, KEEP))
            results = [native.native_scan(buffer, stop, rules) for buffer, stop, rules in runs]
            dropped += sum(result.dropped for result in results if result is not None)
    for line in kinds:
        for stop in range(len(line) + 1):  # each kind line cut at every byte, at the buffer's end
            data = first + line[:stop]
            native.native_scan(data, len(data), KEEP)
    for literal in literals:
        for pad in range(70):
            data = b"x" * pad + literal
            for end in (len(data), len(data) - 1):
                native.native_scan(data, end, few)
    with log_path("continuous", 200).open("rb") as handle:
        data = handle.read(8 * 2**20)
    end = data.rfind(b"\n") + 1
    done = scan(Read(data, end, final=False))
    print(f"no report; {dropped:,} random lines dropped; 8 MiB read: {done.lines:,} lines")


if __name__ == "__main__":
    main()
