"""The secrets corpus: realistic credential formats with fake values, in every position a quote can
take, and a detector that finds any of them (whole, or a 12-character piece) in an output.

Formats follow the providers' documented shapes: W&B 40-hex API keys (`WANDB_API_KEY`, `wandb
login`, `~/.netrc`), Hugging Face `hf_` + 34 characters, AWS `AKIA` + 16 access key ids and 40-char
secret keys, Daytona `dtn_` keys, `Authorization: Bearer` JWTs, passwords in URLs, OpenAI
`sk-proj-` and Anthropic `sk-ant-api03-` keys, GitHub `ghp_` tokens, and generic `password=` /
`token:` pairs. Every value is invented; none is or was a working credential.

`SAMPLES` pair each secret with the carriers it appears in (how a program prints it);
`POSITIONS` put a carrier where quotes come from: a traceback line, a config dump, a URL, a JSON
field. `corpus_lines()` is every carrier in every position, as log lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["POSITIONS", "SAMPLES", "SECRETS", "Sample", "corpus_lines", "leaks"]


@dataclass(frozen=True)
class Sample:
    kind: str
    secret: str
    carriers: tuple[str, ...]


WANDB = "9f2c4e1a7b3d5f6081a2b3c4d5e6f7a8b9c0d1e2"
HF = "hf_QmZx7R2vLk9pT4sW8nB3cY6dJ1fG5hK0aEu"
AWS_ID = "AKIAZ7Q3N5R2T8VX4KWM"
AWS_SECRET = "q8Vn3xR2bT7yK1mP9wZ4cL6dF0gH5jS2aE8uW3oN"
DAYTONA = "dtn_6b1f0c9e4a7d2b8f3e5c1a9d7b4f2e8c0a6d3b1f"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJybC1ydW5uZXIiLCJpYXQiOjE3MjIzNzAwMDB9."
    "Xq3vK8mZ2pR7tL4wN9sB6cF1dH5jG0aEyUoIiPlMkJ"
)
OPAQUE_BEARER = "tkn7Gh2Kp9Qx4Lm8Rz3Vw6Yb1Nc5Ds0Ft"
URL_PASSWORD = "N0tR3alPa55w0rdX9"
OPENAI = "sk-proj-Tq8Wm3Zx6Ry1Lv4Pn7Bk2Hc5Jd9Fg0Sa3Ue6Io8Kl"
ANTHROPIC = "sk-ant-api03-Zr5Xq8Mv2Tn6Lp9Wk3Bh7Cj1Df4Gs0Ha"
GITHUB = "ghp_R8tY2uI6oP0aS4dF7gH1jK5lZ9xC3vB6nM2q"
DB_PASSWORD = "correct-horse-battery-staple-42"
SESSION_TOKEN = "4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"

SAMPLES: tuple[Sample, ...] = (
    Sample("wandb", WANDB, (
        f"WANDB_API_KEY={WANDB}",
        f"wandb login {WANDB}",
        f"machine api.wandb.ai login ops password {WANDB}",
        f"'wandb_api_key': '{WANDB}'",
    )),
    Sample("hf", HF, (
        f"HF_TOKEN={HF}", f"huggingface_hub.login(token='{HF}')", f"--hf-token {HF}",
    )),
    Sample("aws-id", AWS_ID, (f"aws_access_key_id = {AWS_ID}", f"AWS_ACCESS_KEY_ID={AWS_ID}")),
    Sample("aws-secret", AWS_SECRET, (
        f"aws_secret_access_key = {AWS_SECRET}",
        f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}",
        f"credentials {AWS_ID} {AWS_SECRET}",
    )),
    Sample("daytona", DAYTONA, (f"DAYTONA_API_KEY={DAYTONA}", f"Daytona(api_key='{DAYTONA}')")),
    Sample("bearer", JWT, (
        f"Authorization: Bearer {JWT}", f"headers={{'Authorization': 'Bearer {JWT}'}}",
    )),
    Sample("bearer-opaque", OPAQUE_BEARER, (f"authorization: Bearer {OPAQUE_BEARER}",)),
    Sample("url-password", URL_PASSWORD, (
        f"postgres://rl_admin:{URL_PASSWORD}@db.internal:5432/runs",
        f"https://ops:{URL_PASSWORD}@registry.example.com/v2/",
    )),
    Sample("openai", OPENAI, (f"OPENAI_API_KEY={OPENAI}", f"openai.OpenAI(api_key=\"{OPENAI}\")")),
    Sample("anthropic", ANTHROPIC, (f"ANTHROPIC_API_KEY={ANTHROPIC}",)),
    Sample("github", GITHUB, (f"git clone https://{GITHUB}@github.com/org/repo",)),
    Sample("password", DB_PASSWORD, (f"DB_PASSWORD={DB_PASSWORD}", f"--password {DB_PASSWORD}")),
    Sample("token", SESSION_TOKEN, (f"session_token: {SESSION_TOKEN}", f"token={SESSION_TOKEN}")),
)  # fmt: skip
SECRETS: tuple[str, ...] = tuple(sample.secret for sample in SAMPLES)

POSITIONS: dict[str, str] = {
    "traceback": "RuntimeError: request failed after 3 retries ({carrier})",
    "config dump": "2026-07-30 21:00:01.000 | INFO | skyrl_train.utils:dump:40 - env: {carrier}",
    "url": "WARNING: GET https://hub.example.com/api/models?q={carrier} returned 401",
    "json field": '{{"level": "error", "event": "login failed", "detail": {carrier_json}}}',
}


def _placed(position: str, carrier: str) -> str:
    return POSITIONS[position].format(carrier=carrier, carrier_json=json.dumps(carrier))


def corpus_lines() -> list[str]:
    """Every carrier of every sample in every position, one log line each."""
    return [
        _placed(position, carrier)
        for sample in SAMPLES
        for carrier in sample.carriers
        for position in POSITIONS
    ]


def leaks(text: str, secrets: Iterable[str] = SECRETS) -> list[str]:
    """The secrets found in `text`: whole, or their first or last 12 characters."""
    return [s for s in secrets if s in text or s[:12] in text or s[-12:] in text]
