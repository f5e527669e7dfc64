"""Signed verdicts (shared/signing.py): the canonical form, keys and rotation, verification."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest

from shared.settings import Settings
from shared.signing import (
    KeyRing,
    UnverifiedError,
    VerdictKeyError,
    canonical,
    parse_keys,
    sign,
    verify,
)

KEY = "00" * 31 + "01"
ENTRY = {
    "event_id": "evt-1",
    "event_ids": ["evt-1", "evt-2"],
    "job_id": "/ops/jöb",
    "verdict": "KILL",
    "confidence": "high",
    "report_uri": "s3://b/reports/cw/ops/j/2026-07-30T21:15:00Z-evt-1.json",
    "captured_at": "2026-07-30T21:15:00Z",
}


def test_the_signature_is_hmac_sha256_over_the_contracts_canonical_json() -> None:
    """The signature is the HMAC-SHA256 (hex) of the other fields as JSON with sorted keys, no
    spaces and UTF-8 text: what a supervisor in any language can recompute."""
    text = (
        '{"captured_at":"2026-07-30T21:15:00Z","confidence":"high","event_id":"evt-1",'
        '"event_ids":["evt-1","evt-2"],"job_id":"/ops/jöb","report_uri":'
        '"s3://b/reports/cw/ops/j/2026-07-30T21:15:00Z-evt-1.json","verdict":"KILL"}'
    )
    assert canonical(ENTRY) == text.encode()
    expected = hmac.new(bytes.fromhex(KEY), text.encode(), hashlib.sha256).hexdigest()
    signed = sign(ENTRY, parse_keys(KEY))
    assert (signed["key_id"], signed["signature"]) == ("default", expected)
    assert canonical(signed) == canonical(ENTRY)  # the pair itself is not covered


def test_every_field_is_covered() -> None:
    """Changing any field, or adding one, after signing makes it fail to verify."""
    ring = parse_keys(KEY)
    signed = sign(ENTRY, ring)
    verify(signed, ring)
    for name in ENTRY:
        changed = "x" if name != "event_ids" else ["evt-1"]
        with pytest.raises(UnverifiedError, match="bad signature"):
            verify({**signed, name: changed}, ring)
    with pytest.raises(UnverifiedError, match="bad signature"):
        verify({**signed, "extra": "1"}, ring)


@pytest.mark.parametrize(
    ("document", "kind"),
    [
        (ENTRY, "unsigned"),
        ({**ENTRY, "key_id": "default"}, "malformed"),
        ({**ENTRY, "key_id": "de\x1bfault", "signature": "0" * 64}, "malformed"),
        ({**ENTRY, "key_id": "other", "signature": "0" * 64}, "unknown_key"),
        ({**ENTRY, "key_id": "default", "signature": "0" * 64}, "bad_signature"),
    ],
)
def test_refusals_say_why(document: dict[str, object], kind: str) -> None:
    """Unsigned, malformed, unknown-key and wrong signatures are refused with their kind."""
    with pytest.raises(UnverifiedError) as refused:
        verify(document, parse_keys(KEY))
    assert refused.value.kind == kind and "\x1b" not in refused.value.reason


def test_rotation_signs_with_the_first_key_and_verifies_with_all() -> None:
    """`new:hex,old:hex`: entries are signed with `new`; those signed with `old` still verify,
    and dropping `old` refuses them."""
    old, new = "old:" + "aa" * 32, "new:" + "bb" * 32
    before = sign(ENTRY, parse_keys(old))
    rotating = parse_keys(f"{new}, {old}")
    assert rotating.signing_id == "new" and sign(ENTRY, rotating)["key_id"] == "new"
    verify(before, rotating)
    with pytest.raises(UnverifiedError, match="not held"):
        verify(before, parse_keys(new))


@pytest.mark.parametrize(("size", "usable"), [(31, False), (32, True)])
def test_a_key_needs_32_bytes(size: int, usable: bool) -> None:
    """A 32-byte key is accepted; 31 bytes is refused, naming the minimum."""
    if usable:
        assert len(parse_keys("ab" * size).keys["default"]) == size
    else:
        with pytest.raises(VerdictKeyError, match="at least 32"):
            parse_keys("ab" * size)


@pytest.mark.parametrize(
    "text", ["", " , ", "xyz" * 30, f"a:{'ab' * 32},a:{'cd' * 32}", f"{'ab' * 32},{'cd' * 32}"]
)
def test_unusable_key_settings_are_refused(text: str) -> None:
    """Empty, non-hex, doubled ids and a list without ids are refused."""
    with pytest.raises(VerdictKeyError):
        parse_keys(text)


def test_a_key_ring_never_shows_its_keys() -> None:
    """The ring's repr (in a traceback, a log) names key ids, never key bytes."""
    ring = parse_keys(f"k1:{'ab' * 32}")
    assert "abab" not in repr(ring) and "k1" in repr(ring)
    with pytest.raises(VerdictKeyError):
        KeyRing("missing", {"k1": b"x" * 32})


def test_settings_read_the_key_or_its_file(tmp_path: Path) -> None:
    """RLHEALTH_VERDICT_KEY or RLHEALTH_VERDICT_KEY_FILE (not both); none is an error naming
    both settings."""
    path = tmp_path / "key"
    path.write_text("ab" * 32 + "\n")
    assert Settings(verdict_key=None, verdict_key_file=path).verdict_keys().signing_id == "default"
    with pytest.raises(VerdictKeyError, match="not both"):
        Settings(verdict_key="ab" * 32, verdict_key_file=path).verdict_keys()  # type: ignore[arg-type]
    with pytest.raises(VerdictKeyError, match="RLHEALTH_VERDICT_KEY or RLHEALTH_VERDICT_KEY_FILE"):
        Settings(verdict_key=None).verdict_keys()
    with pytest.raises(VerdictKeyError, match="RLHEALTH_VERDICT_KEY_FILE"):
        Settings(verdict_key=None, verdict_key_file=tmp_path / "absent").verdict_keys()
