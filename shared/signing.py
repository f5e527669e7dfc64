"""Signed verdicts: the HMAC every verdict entry and stored JSON report carries
(docs/interface.md#the-pipeline).

A verdict is an order to a supervisor, and Redis and S3 can be written by more hands than the
pipeline's (the watcher publishes alerts on the same Redis). So the pipeline signs what it says,
and every reader checks the signature before it shows or returns a verdict:

- `signature` is HMAC-SHA256 (lower-case hex) over the document's other fields, as canonical
  JSON: keys sorted at every level, no spaces, UTF-8 (`canonical`); `key_id` names the key.
- The keys come from `RLHEALTH_VERDICT_KEY` or `RLHEALTH_VERDICT_KEY_FILE`: one hex key of at
  least 32 bytes (key id `default`), or `kid:hex,kid:hex` to rotate keys — the first one signs,
  every one verifies (`parse_keys`).

Pure: no I/O, no settings. The same functions sign (worker, ingest) and verify (supervisor helper,
`rl-health verdicts`, the board), so there is one canonical form.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "DEFAULT_KEY_ID",
    "KEY_ID_FIELD",
    "MIN_KEY_BYTES",
    "SIGNATURE_FIELD",
    "KeyRing",
    "UnverifiedError",
    "VerdictKeyError",
    "canonical",
    "parse_keys",
    "sign",
    "verify",
]

KEY_ID_FIELD: Final = "key_id"
SIGNATURE_FIELD: Final = "signature"
DEFAULT_KEY_ID: Final = "default"
MIN_KEY_BYTES: Final = 32  # HMAC-SHA256's own block of strength: a shorter key is guessable sooner
_KEY_ID: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_SIGNATURE: Final = re.compile(r"^[0-9a-f]{64}$")


class VerdictKeyError(ValueError):
    """A verdict key setting that cannot be used; the message never holds key material."""


class UnverifiedError(ValueError):
    """A document whose signature is missing or does not verify: `reason` says why in a line,
    `kind` in a word (`unsigned`, `malformed`, `unknown_key`, `bad_signature`) for a metric."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


@dataclass(frozen=True)
class KeyRing:
    """The verdict keys of one process: `signing_id` signs, every key in `keys` verifies."""

    signing_id: str
    keys: Mapping[str, bytes] = field(repr=False)

    def __post_init__(self) -> None:
        if self.signing_id not in self.keys:
            raise VerdictKeyError(f"the signing key id {self.signing_id!r} has no key")

    def __repr__(self) -> str:  # never the keys themselves, even in a traceback
        return f"KeyRing(signing_id={self.signing_id!r}, key_ids={sorted(self.keys)!r})"


def _key_bytes(kid: str, text: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise VerdictKeyError(f"the key {kid!r} is not hex") from None
    if len(key) < MIN_KEY_BYTES:
        raise VerdictKeyError(
            f"the key {kid!r} has {len(key)} bytes; at least {MIN_KEY_BYTES} are needed "
            f"({2 * MIN_KEY_BYTES} hex digits)"
        )
    return key


def _pair(item: str) -> tuple[str, str]:
    kid, sep, text = item.partition(":")
    kid = kid.strip()
    if not sep or not _KEY_ID.match(kid):
        raise VerdictKeyError(
            "a rotation list holds `kid:hex` items, each key id of letters, digits, `._-`"
        )
    return kid, text


def parse_keys(text: str) -> KeyRing:
    """The key ring of a setting's value: `hex` (key id `default`) or `kid:hex,kid:hex,...`."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise VerdictKeyError("no key is given")
    pairs = [(DEFAULT_KEY_ID, items[0])] if len(items) == 1 and ":" not in items[0] else []
    pairs = pairs or [_pair(item) for item in items]
    keys: dict[str, bytes] = {}
    for kid, hex_text in pairs:
        if kid in keys:
            raise VerdictKeyError(f"the key id {kid!r} is given twice")
        keys[kid] = _key_bytes(kid, hex_text)
    return KeyRing(pairs[0][0], keys)


def canonical(document: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: every field but `key_id` and `signature`, as JSON with keys
    sorted at every level, no spaces, non-ASCII characters as UTF-8."""
    body = {k: v for k, v in document.items() if k not in (KEY_ID_FIELD, SIGNATURE_FIELD)}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _mac(key: bytes, document: Mapping[str, Any]) -> str:
    return hmac.new(key, canonical(document), hashlib.sha256).hexdigest()


def sign(document: Mapping[str, Any], ring: KeyRing) -> dict[str, Any]:
    """`document` with `key_id` and `signature` (by the ring's signing key) after its fields;
    any pair it carried is replaced."""
    body = {k: v for k, v in document.items() if k not in (KEY_ID_FIELD, SIGNATURE_FIELD)}
    mac = _mac(ring.keys[ring.signing_id], body)
    return {**body, KEY_ID_FIELD: ring.signing_id, SIGNATURE_FIELD: mac}


def verify(document: Mapping[str, Any], ring: KeyRing) -> None:
    """Return when `document`'s signature verifies under the key its `key_id` names; raise
    `UnverifiedError` saying why not. The reason quotes no value the document chose."""
    kid, signature = document.get(KEY_ID_FIELD), document.get(SIGNATURE_FIELD)
    if not kid and not signature:
        raise UnverifiedError("unsigned (no key_id and signature)", "unsigned")
    if not isinstance(kid, str) or not _KEY_ID.match(kid):
        raise UnverifiedError("malformed key_id", "malformed")
    if not isinstance(signature, str) or not _SIGNATURE.match(signature):
        raise UnverifiedError("malformed signature (64 lower-case hex digits)", "malformed")
    key = ring.keys.get(kid)
    if key is None:
        raise UnverifiedError(f"signed with key id {kid!r}, not held here", "unknown_key")
    if not hmac.compare_digest(_mac(key, document), signature):
        raise UnverifiedError(f"bad signature (key id {kid!r})", "bad_signature")
