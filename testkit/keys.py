"""The verdict keys of the tests: every test runs with `TEST_KEY` as RLHEALTH_VERDICT_KEY (the
conftest sets it), as every pipeline role must; `OTHER_KEYS` is a key the pipeline does not hold
(a forger's)."""

from __future__ import annotations

from typing import Any

from shared.signing import KeyRing, parse_keys

TEST_KEY = "7e" * 32  # 32 bytes of hex: the shortest key the settings accept
TEST_KEYS: KeyRing = parse_keys(TEST_KEY)
OTHER_KEYS: KeyRing = parse_keys("forger:" + "a1" * 32)


def signed_fields(fields: dict[str, Any], ring: KeyRing = TEST_KEYS) -> dict[str, str]:
    """Verdict stream fields (event_ids as a list) signed by `ring`, encoded as the stream holds
    them (event_ids as a JSON array)."""
    import json

    from shared.signing import sign

    document = sign(fields, ring)
    return {k: json.dumps(v) if k == "event_ids" else str(v) for k, v in document.items()}
