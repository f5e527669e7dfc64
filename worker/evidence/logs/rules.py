"""The parser's literal rules: what flags a line, its kind and error kind, the traceback block
starts, the window and line caps, and the rest lines the native pass keeps (`KEEP`).
"""

from __future__ import annotations

import re
from typing import Final

from worker.evidence.failures import catalogue
from worker.evidence.logs import native

__all__ = [
    "BLOCK_STARTS",
    "CLASS_LITERALS",
    "ENGINE_LITERAL",
    "ERROR_RULES",
    "FAILURE_LITERALS",
    "FLAG_LITERALS",
    "HEAD_LINES",
    "HEAD_SCAN_LINES",
    "KEEP",
    "KIND_RULES",
    "LINE_MAX_BYTES",
    "NATIVE_KINDS",
    "TRACEBACK",
    "UNHANDLED",
    "WINDOW_LINES",
]

# A pprint-ed dict or traceback closes within this many lines: the tables do not depend on the cuts.
WINDOW_LINES: Final = 200
# A longer line is cut (a WANDB_MIRROR record of a thousand metrics is ~40 KB)
LINE_MAX_BYTES: Final = 2**20
HEAD_SCAN_LINES: Final = 1000  # the summary head: the first HEAD_LINES non-empty lines among these
HEAD_LINES: Final = 5
TRACEBACK: Final = "Traceback (most recent call last)"
UNHANDLED: Final = "Unhandled error (suppress with "
BLOCK_STARTS: Final = (TRACEBACK, UNHANDLED)
ENGINE_LITERAL: Final = "Avg prompt throughput"

# (kind, literal the message must start with or contain, starts_with?)
KIND_RULES: Final[tuple[tuple[str, str, bool], ...]] = (
    ("mirror", "WANDB_MIRROR kind=", False),
    ("dict_start", "{'", True),
    ("timer", "Started: '", True),
    ("timer", "Finished: '", True),
    ("reward", "reward/", True),
    ("reward", "avg_final_rewards: ", False),
    ("step_progress", "Training Step Progress", False),
    ("buffer_progress", "Generation Buffer Progress", False),
    ("breakdown", "Exception breakdown: ", False),
    ("batch", "Batch generation ", False),
    ("boundary", "[iris setup] step 1/", True),
    ("scratch", "No checkpoint found", False),
    ("checkpoint_loaded", "Loading checkpoint from", False),
    ("resumed", "Resuming from global_step", False),
    # Ray's own start-up lines, and a launcher's (`attempts`: an in-log restart)
    ("ray_start", "Started a local Ray instance", False),
    ("ray_start", "Connecting to existing Ray cluster", False),
    ("ray_start", "Ray cluster initialized", False),
)

# (error kind, literal); the first that matches names the line.
ERROR_RULES: Final[tuple[tuple[str, str], ...]] = (
    ("cuda_oom", "CUDA out of memory"),
    # torch's, not Ray's `ray.exceptions.OutOfMemoryError` (host memory: `host_oom`)
    ("cuda_oom", "torch.OutOfMemoryError"),
    ("cuda_oom", "torch.cuda.OutOfMemoryError"),
    ("cuda_error", "CUDA error"),
    ("internal_assert", "INTERNAL ASSERT"),
    ("nccl_watchdog_timeout", "Watchdog caught collective operation timeout"),
    ("nccl_watchdog_stuck", "ProcessGroupNCCL's watchdog got stuck"),
    ("actor_died", "ActorDiedError"),
    ("worker_crashed", "WorkerCrashedError"),
    ("ray_task_error", "RayTaskError"),
    ("train_loop_failed", "Train loop failed"),
    ("config_override", "Could not override '"),
    ("trajectory_failed", "Trajectory "),
    ("shm_broadcast", "No available shared memory broadcast block"),
    ("image_pull_backoff", "ImagePullBackOff"),
    ("sandbox_error", "Failed to create sandbox"),
    ("sandbox_error", "DaytonaError"),
    ("sandbox_error", "SandboxBuildFailedError"),
    ("verifier_error", "VerifierTimeoutError"),
    ("verifier_error", "RewardFileNotFoundError"),
    ("verifier_error", "RewardFileEmptyError"),
    ("verifier_error", "VerifierOutputParseError"),
)

# What a final exception line or a wrapped exception contains, whatever its type.
_EXCEPTION_MARKERS: Final = (
    "Error: ",
    "Error(",
    "Exception: ",
    "Exception(",
    "Exit: ",
    ".errors.",
    ".exceptions.",
)
FAILURE_LITERALS: Final[tuple[str, ...]] = tuple(
    sorted({*catalogue().literals, *_EXCEPTION_MARKERS, UNHANDLED})
)

_INTEREST: Final[list[str]] = sorted(
    {lit for _, lit, _ in KIND_RULES}
    | {lit for _, lit in ERROR_RULES}
    | {"': ", TRACEBACK}
    | set(FAILURE_LITERALS)
)

# A line is flagged when it holds an anchor; every literal above holds one. Few anchors, none short
# and lowercase where possible: past ~52 the regex engine's literal prefilter slows down sharply,
# and an Iris job name holding a lowercase anchor would flag every line (docs/parsing.md).
_ANCHORS: Final = (
    # failure vocabulary
    *("Error", " error", "ERROR", "Exception", ".errors.", ".exceptions.", "Exit", "SIG"),
    *("NCCL", "CUDA", "Cuda failure", "failed", "Failed", "FAILED", "FATAL"),
    # failure lines without those words
    *("The actor", "A worker died", "marked dead", "Task was killed", "(OOM)", "shutting down"),
    *("Sandbox", "Snapshot with", "pull access denied", "No reward file"),
    *("PreemptionMode", "In config: Override", "not in struct", "taking the entire"),
    *("terminate called",),
    # the older literal rules
    *("INTERNAL ASSERT", "Watchdog caught", "Could not override", "Trajectory ", "No available"),
    *("ImagePullBackOff", TRACEBACK, "WANDB_MIRROR kind=", "Batch generation ", "Started: '"),
    *("Finished: '", "': ", "{'", "reward/", "avg_final_rewards: ", "Progress"),
    *("[iris setup] step 1/", "No checkpoint found", "Loading checkpoint from"),
    # one anchor for Ray's start-up lines (`Ray instance` and `Ray cluster` cost 12 ms a 20 MB read)
    *("Resuming from global_step", "Ray "),
)
# A literal no anchor covers (a new catalogue entry, say) flags lines by itself.
_UNCOVERED: Final = tuple(lit for lit in _INTEREST if not any(a in lit for a in _ANCHORS))

# Every literal that flags a line, longest first (one leftmost-first search finds the first); the
# native pass drops a line that holds none and that nothing else reads.
FLAG_LITERALS: Final[tuple[str, ...]] = tuple(
    sorted({*_ANCHORS, *_UNCOVERED, ENGINE_LITERAL}, key=lambda lit: (-len(lit), lit))
)
# The native pass reads a strict line of a native kind only when its message holds none of
# CLASS_LITERALS (the flag literals within an error, failure or traceback literal): every literal
# that could classify it otherwise holds one, so it has no error or failure.
_CLASSIFYING: Final = (*(lit for _, lit in ERROR_RULES), *FAILURE_LITERALS, TRACEBACK)
CLASS_LITERALS: Final[tuple[str, ...]] = tuple(
    flag for flag in FLAG_LITERALS if any(flag in lit for lit in _CLASSIFYING)
)
_LEVELS: Final = ("INFO", "WARNING", "ERROR", "DEBUG", "CRITICAL")


def _native_kind(literal: str) -> bool:
    """Whether a message opening with `literal` has its kind, the prefixes before it read as the
    native pass reads them: no other kind literal can match where it starts (none is a prefix of
    it or starts with it), and no prefix or header pattern can start at it (no `(`, `[`, digit,
    space or log level, and not a word then `:` and a digit, as NCCL's `host:pid:tid`)."""
    others = (lit for _, lit, _ in KIND_RULES if lit != literal)
    word = re.match(r"[\w.-]*", literal)
    # what follows the word (a `:` closing the literal might be followed by a digit)
    after = literal[word.end() : word.end() + 2] + "0" if word is not None else ""
    return (
        literal.isascii()
        and literal.isprintable()
        and not any(lit.startswith(literal) or literal.startswith(lit) for lit in others)
        and literal[0] not in "([ " + "0123456789"
        and len(after) >= 2
        and not (after[0] == ":" and after[1] in "0123456789")
        and not any(literal.startswith(w) or w.startswith(literal) for w in _LEVELS)
    )


# (literal, kind) of the kinds the native pass reads.
NATIVE_KINDS: Final[tuple[tuple[str, str], ...]] = tuple(
    (lit, kind) for kind, lit, _ in KIND_RULES if _native_kind(lit)
)


KEEP: Final = native.rules(
    literals=FLAG_LITERALS,
    blocks=BLOCK_STARTS,
    window=WINDOW_LINES,
    first_lines=max(HEAD_SCAN_LINES, WINDOW_LINES + 1),
    long_line=LINE_MAX_BYTES // 16,
    classes=CLASS_LITERALS,
    kinds=NATIVE_KINDS,
)
