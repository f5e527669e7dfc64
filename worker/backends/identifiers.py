"""Strict patterns for every value that reaches a command line from data.

Job ids, clusters, users, task ids, pod names, label values, Slurm job numbers and pids come from
bundles, alerts and cluster replies: they are data. Each is checked here before it joins an argv:
it must match its pattern, and none of the patterns lets a value start with `-` (it can never become
an option), hold a space, a quote, a shell character or a control character. A value that fails is
refused with `UnsafeValueError`, which names the kind and shows the value escaped.
"""

from __future__ import annotations

import re
from typing import Final

from shared.redact import clean, cut_bytes

__all__ = [
    "PATTERNS",
    "RefusedValueError",
    "UnsafeValueError",
    "checked",
    "like_prefix",
]

_SEGMENT: Final = r"[A-Za-z0-9_][A-Za-z0-9_.=+@-]{0,127}"
PATTERNS: Final[dict[str, re.Pattern[str]]] = {
    # `/<user>/<job>` (nested jobs add segments), `/<user>/<job>/<task>` for a task
    "job id": re.compile(rf"^/?{_SEGMENT}(?:/{_SEGMENT}){{0,15}}$"),
    "task id": re.compile(rf"^/?{_SEGMENT}(?:/{_SEGMENT}){{0,15}}(?::[0-9]{{1,9}})?$"),
    "cluster": re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"),
    "user": re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"),
    # RFC 1123 names, as the Kubernetes API server enforces them for pods and namespaces
    "pod": re.compile(r"^[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?$"),
    "namespace": re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$"),
    "label value": re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$"),
    "kube context": re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@/-]{0,252}$"),
    "slurm job": re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,9})?$"),
    "pid": re.compile(r"^[1-9][0-9]{0,9}$"),
    "url": re.compile(r"^https?://[A-Za-z0-9._~\[\]:-]+(?:/[A-Za-z0-9._~/-]*)?$"),
}


class RefusedValueError(ValueError):
    """A value from data or settings that may not reach a command: live probes are refused."""


class UnsafeValueError(RefusedValueError):
    """A value from data that does not fit the strict pattern of its kind."""

    def __init__(self, kind: str, value: object) -> None:
        shown = cut_bytes(clean(str(value)), 120)
        super().__init__(f"{kind} {shown!r} is not a valid {kind}: refused as a command argument")
        self.kind = kind


def checked(kind: str, value: object) -> str:
    """`value` when it matches the pattern of `kind` (a key of PATTERNS); else UnsafeValueError."""
    if not isinstance(value, str) or not PATTERNS[kind].fullmatch(value):
        raise UnsafeValueError(kind, value)
    return value


def like_prefix(value: str) -> str:
    """A SQL string literal body matching values that start with `value` in `LIKE ... ESCAPE '\\'`:
    the wildcards `%` and `_` and the escape character are escaped, quotes doubled."""
    escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("'", "''")
