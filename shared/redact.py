"""The one redactor: credentials out, control characters escaped, long text cut by bytes.

Every quote, report field, verdict entry, written table, frozen evidence file, probe file and log
message passes through here, at the point where the text is made (a `Quote` validates its text with
`clean`; the writers call `redact_text`, `redact_data` or `redact_frame`), so every sink inherits
it.

- `redact_text` replaces credentials by `<redacted:KIND>`: W&B keys, Hugging Face `hf_` tokens, AWS
  access key ids and secret keys, Daytona `dtn_` keys, `Authorization`/`Bearer` headers, passwords
  in URLs (`user:password@`), `sk-…` API keys, JWTs, GitHub and Slack tokens, private key blocks,
  and generic `KEY=…` / `token: …` / `--password …` pairs (any value for an unambiguous name such as
  `password` or `api_key`; high-entropy values only for the ambiguous `token` and `key`).
- `escape_controls` writes C0/C1 control characters, line and paragraph separators and bidi
  overrides as `\\n`, `\\x1b`, `\\u202e`, so no value can start a line or move the cursor.
- `clean` is both; `cut_bytes` cuts UTF-8 text at a byte budget with a visible marker;
  `clean_cut` does both on a bounded window of a text of any size.
- `redact_data` walks JSON-like data and also redacts a value by its key (`{"WANDB_API_KEY": "…"}`,
  `{"name": "HF_TOKEN", "value": "…"}`).
- `redact_frame` redacts every string column of a polars frame: a vectorised prefilter
  (`PREFILTER`, a superset of every rule) picks the few cells that may hold a credential, and only
  those go through `redact_text`.

Redaction is idempotent: `redact_text(redact_text(x)) == redact_text(x)`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "PREFILTER",
    "RULES_DIGEST",
    "clean",
    "clean_cut",
    "cut_bytes",
    "escape_controls",
    "install_log_redaction",
    "redact_columns",
    "redact_data",
    "redact_frame",
    "redact_text",
]

Replace = Callable[[re.Match[str]], str]


def _tag(kind: str) -> str:
    return f"<redacted:{kind}>"


# --- what counts as a secret value ---------------------------------------------------------------

_PLACEHOLDERS: Final = frozenset(
    {"", "none", "null", "nil", "true", "false", "***", "xxx", "redacted", "changeme", "..."}
)
_STRONG_NAME: Final = (
    r"api[_.-]?key|apikey|access[_.-]?key(?:[_.-]?id)?|secret[_.-]?(?:access[_.-]?)?key|"
    r"private[_.-]?key|client[_.-]?secret|auth[_.-]?token|access[_.-]?token|refresh[_.-]?token|"
    r"secret|password|passwd|passphrase|pwd|credentials?"
)
_WEAK_NAME: Final = r"token|key"
_NAME: Final = rf"[A-Za-z0-9_.-]*?(?:{_STRONG_NAME}|{_WEAK_NAME})"
_STRONG_END: Final = re.compile(rf"(?i)(?:{_STRONG_NAME})$")
_SECRET_NAME: Final = re.compile(rf"(?i)^{_NAME}$")


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _high_entropy(value: str) -> bool:
    """A value that looks generated: long, letters and digits mixed, not a word repeated."""
    has_letter = any(c.isalpha() for c in value)
    has_digit = any(c.isdigit() for c in value)
    return len(value) >= 16 and has_letter and has_digit and _entropy(value) >= 3.0


def _secret_value(name: str, value: str) -> bool:
    """Whether `value`, held under the key `name`, is a credential to hide."""
    stripped = value.strip().strip("\"'")
    if stripped.lower() in _PLACEHOLDERS or stripped.startswith(("<redacted:", "${", "$")):
        return False
    if _STRONG_END.search(name.rstrip("\"' ")):
        return True
    return _high_entropy(stripped)


def secret_name(name: str) -> bool:
    """Whether a key or variable name is one credentials are kept under (`HF_TOKEN`, `api_key`)."""
    return bool(_SECRET_NAME.match(name))


# --- the rules -----------------------------------------------------------------------------------


def _keep_prefix(kind: str, group: str = "secret") -> Replace:
    """Replace only the named group; what precedes it (a header name, a scheme) stays readable."""

    def replace(match: re.Match[str]) -> str:
        start, end = match.span(group)
        whole = match.group(0)
        offset = match.start(0)
        return whole[: start - offset] + _tag(kind) + whole[end - offset :]

    return replace


def _whole(kind: str) -> Replace:
    return lambda _match: _tag(kind)


def _pair(match: re.Match[str]) -> str:
    """A `name=value` pair: the value goes when the name and value say it is a credential."""
    if not _secret_value(match["name"], match["secret"]):
        return match.group(0)
    return _keep_prefix("secret")(match)


def _aws_secret(match: re.Match[str]) -> str:
    """A bare 40-character base64 run: an AWS secret key when it looks random (paths do not)."""
    value = match.group(0)
    mixed = any(c.isupper() for c in value) and any(c.islower() for c in value)
    random = mixed and any(c.isdigit() for c in value) and value.count("/") <= 3
    return _tag("aws-secret-key") if random and _entropy(value) >= 4.2 else value


_VALUE: Final = r"[^\s\"',;}\]<>]+"
_SEP: Final = r"[\"']?\s*[:=]\s*[\"']?"

RULES: Final[tuple[tuple[re.Pattern[str], Replace], ...]] = (
    (
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|.*)",
            re.DOTALL,
        ),
        _whole("private-key"),
    ),
    (
        re.compile(
            r"(?i)\b[a-z][a-z0-9+.-]{1,20}://[^\s/:@<>\"']*:(?P<secret>[^\s/<>\"']+)@(?=[^\s@/]+)"
        ),
        _keep_prefix("password"),
    ),
    (  # `user:password@host` without a scheme (or after a normaliser took the scheme away)
        re.compile(r"(?<![\w.%+-])[\w.%+-]*:(?P<secret>[^\s:/@<>\"'`]{3,})@(?=[A-Za-z0-9<])"),
        _keep_prefix("password"),
    ),
    (
        re.compile(
            r"(?i)\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
            r"(?:(?:bearer|basic|token|digest|apikey)\s+)?"
            r"(?!(?:bearer|basic|token|digest|apikey)\s)(?P<secret>[^\s\"',;<>]+)"
        ),
        _keep_prefix("bearer"),
    ),
    (re.compile(r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/=-]{8,})"), _keep_prefix("bearer")),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), _whole("hf-token")),
    (re.compile(r"\bdtn_[A-Za-z0-9_-]{16,}"), _whole("daytona-key")),
    (re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{16,}"), _whole("api-key")),
    (re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b"), _whole("aws-access-key")),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), _whole("jwt")),
    (
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
        _whole("github"),
    ),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), _whole("slack-token")),
    (
        re.compile(
            r"(?i)(?P<name>machine\s+api\.wandb\.ai\b.{0,300}?\bpassword)\s+(?P<secret>[^\s<]\S*)",
            re.DOTALL,
        ),
        _keep_prefix("wandb-key"),
    ),
    (
        re.compile(
            r"(?i)\bwandb\s+login\s+(?:--?[\w-]+(?:=\S+)?\s+)*(?P<secret>[A-Za-z0-9_-]{32,})"
        ),
        _keep_prefix("wandb-key"),
    ),
    (
        re.compile(rf"(?i)(?P<name>wandb[_.-]?(?:api[_.-]?)?key){_SEP}(?P<secret>{_VALUE})"),
        _keep_prefix("wandb-key"),
    ),
    (
        re.compile(
            rf"(?i)\"name\"\s*:\s*\"(?P<name>{_NAME})\"\s*,\s*\"value\"\s*:\s*\""
            r"(?P<secret>(?:[^\"\\]|\\.)*)\""
        ),
        _pair,
    ),
    (
        re.compile(
            rf"(?i)(?<![A-Za-z0-9])(?P<name>{_NAME})(?![A-Za-z0-9]){_SEP}(?P<secret>{_VALUE})"
        ),
        _pair,
    ),
    (
        re.compile(rf"(?i)(?P<name>--(?:{_NAME}))(?![\w-])\s+(?!-)(?P<secret>{_VALUE})"),
        _pair,
    ),
    (re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"), _aws_secret),
)

# A superset of every rule in the regex dialect polars speaks (no look-around): a cell it does not
# match holds no credential, so only matching cells pay for the Python rules.
PREFILTER: Final = (
    r"(?i)(private key|://[^/\s]*:[^\s]*@|:[^\s:/@<>\"'`]{3,}@[a-z0-9<]|authoriz|bearer|"
    r"hf_|dtn_|sk-|akia|asia|abia|acca|eyj|"
    r"gh[pousr]_|github_pat_|xox[abposr]-|wandb|key|token|secret|passw|passphrase|pwd|credential|"
    r"[A-Za-z0-9/+]{40})"
)
_PREFILTER: Final = re.compile(PREFILTER)


def redact_text(text: str) -> str:
    """`text` with every credential the rules know replaced by `<redacted:KIND>`."""
    if not text or not _PREFILTER.search(text):
        return text
    for pattern, replace in RULES:
        text = pattern.sub(replace, text)
    return text


# --- control characters and length ---------------------------------------------------------------

_CONTROL: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]"
)
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape_controls(text: str) -> str:
    """Control characters, line separators and bidi overrides written as visible escapes."""
    return _CONTROL.sub(_escape, text)


def clean(text: str) -> str:
    """Redacted, then escaped: safe to print on one line of any report or log."""
    return escape_controls(redact_text(text))


def cut_bytes(text: str, limit: int, *, total: int | None = None) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, ending with `…[+N bytes]` when it was cut;
    `total` is the size of the original when `text` is already a window of it."""
    data = text.encode("utf-8")
    size = len(data) if total is None else total
    if size <= limit and len(data) <= limit:
        return text
    room = max(0, limit - 24)  # the marker takes at most 24 bytes
    kept = data[:room].decode("utf-8", errors="ignore")
    return f"{kept}…[+{max(size - len(kept.encode('utf-8')), 1)} bytes]"


def clean_cut(text: str, limit: int) -> str:
    """`clean` then `cut_bytes`, reading only a window of a huge `text` (a line may be 300 MB)."""
    window = 16 * limit
    if len(text) <= window:
        return cut_bytes(clean(text), limit)
    return cut_bytes(clean(text[:window]), limit, total=len(text.encode("utf-8")))


# --- structured data -----------------------------------------------------------------------------


def _redact_item(key: object, value: Any) -> Any:
    plain = isinstance(value, str | int) and not isinstance(value, bool)
    if plain and isinstance(key, str) and secret_name(key) and _secret_value(key, str(value)):
        return _tag("secret")
    return redact_data(value)


def _redact_mapping(data: Mapping[Any, Any]) -> dict[Any, Any]:
    name = data.get("name")
    out = {key: _redact_item(key, value) for key, value in data.items()}
    value = data.get("value")
    named = isinstance(name, str) and isinstance(value, str) and secret_name(name)
    if named and _secret_value(str(name), str(value)):
        out["value"] = _tag("secret")
    return out


def redact_data(data: Any) -> Any:
    """JSON-like `data`: every string redacted, every value kept under a secret key hidden."""
    if isinstance(data, str):
        return redact_text(data)
    if isinstance(data, Mapping):
        return _redact_mapping(data)
    if isinstance(data, list | tuple):
        return [redact_data(item) for item in data]
    return data


def redact_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """Column names redacted (a wide metrics table is named by its metric keys, which come from
    the log); two names that differ only in a secret stay apart with a `#N` suffix."""
    names = frame.columns
    if not any(_PREFILTER.search(name) for name in names):
        return frame
    taken: set[str] = set()
    renamed: list[str] = []
    for name in names:
        new, n = redact_text(name), 1
        while (candidate := new if n == 1 else f"{new}#{n}") in taken:
            n += 1
        taken.add(candidate)
        renamed.append(candidate)
    return frame.rename(dict(zip(names, renamed, strict=True)))


def redact_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """Every string column redacted; only the cells the vectorised prefilter flags are rewritten;
    column names too (`redact_columns`)."""
    import polars as pl

    frame = redact_columns(frame)

    for name, dtype in frame.schema.items():
        if dtype != pl.String:
            continue
        column = frame.get_column(name)
        flagged = column.str.contains(PREFILTER).fill_null(False)
        if not flagged.any():
            continue
        rows = flagged.arg_true()
        fixed = pl.Series(name, [redact_text(v) for v in column.gather(rows)], dtype=pl.String)
        frame = frame.with_columns(column.clone().scatter(rows, fixed))
    return frame


# --- log messages --------------------------------------------------------------------------------


def _cleaned_record_factory(previous: Callable[..., logging.LogRecord]) -> Callable[..., Any]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.msg, record.args = clean(record.getMessage()), None
        if record.exc_info:
            trace = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact_text(trace)
        return record

    factory.rlhealth_redacts = True  # type: ignore[attr-defined]
    return factory


def install_log_redaction() -> None:
    """Make every log record of this process redacted and escaped (once; later calls do nothing)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "rlhealth_redacts", False):
        return
    logging.setLogRecordFactory(_cleaned_record_factory(previous))


# --- the rules' fingerprint ----------------------------------------------------------------------


def _rules_digest() -> str:
    """A digest of this module's source: it changes with any change to what is redacted (or
    how), so what was found clean, or stored redacted, under older rules is not trusted under
    newer ones (`worker.pipeline.logcache`'s clean set, `worker.evidence.frozen`'s parts)."""
    try:
        source = Path(__file__).read_bytes()
    except OSError:  # no source beside the code: the patterns stand for it
        source = "\0".join([PREFILTER, *(rule.pattern for rule, _ in RULES)]).encode()
    return hashlib.sha256(source).hexdigest()[:16]


RULES_DIGEST: Final = _rules_digest()
