"""One redaction policy, applied wherever data leaves memory: the store, reports, log files,
console lines and `--json` documents read the redacted form; only the process that needs a
secret (an engine's launch, a client's connection) ever holds it.

A value is secret when the name that holds it says so: a key, environment variable or flag
whose words include token, key, secret, password, credential, auth, cookie, ... (HF_TOKEN,
api-key, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY), but not a count or size of tokens
(max_tokens, num_prompt_tokens). Recognised in:

- mappings (`{"HF_TOKEN": ...}`) at any depth, and argument lists (`["--api-key", X]`,
  `["--hf-token=X"]`);
- URLs: the userinfo (`https://alice:PW@host`, `https://TOKEN@host`) and query parameters with
  secret names (`?api_key=X`);
- free text (a log line, an error, a launch line in one string): `K=V` and `K: V` anywhere
  (`run HF_TOKEN=x`, `export OPENAI_API_KEY=x`, `"api_key": "x"`), `--flag value`,
  `Authorization: Bearer X` and any `Bearer X` / `Basic X`.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

REDACTED = "<redacted>"

# a name is secret when one of its words (split at _ - . and case changes) is one of these
_SECRET_WORDS = frozenset({
    "token", "tokens", "key", "apikey", "secret", "secrets", "password", "passwd", "pwd",
    "passphrase", "credential", "credentials", "auth", "authorization", "cookie",
    "signature", "sig", "private", "bearer",
})
# ("session" is not among them: workloads count sessions; AWS_SESSION_TOKEN has its "token")
# names that contain a secret word but hold no secret (counts and sizes of tokens, sort keys)
_NOT_SECRET = re.compile(
    r"(^|_)(max|min|num|total|input|output|prompt|completion|draft|accepted|generation|new|"
    r"special|sort|primary|load|cache|spec|eos|bos)_?([a-z0-9]+_){0,3}(tokens?|keys?)($|_)"
    r"|tokens?_(per|s$|count)"
    r"|^(key|keys|tokens|token_ids|token_strs|load_key|tokenizer|tokenizer_path|tokenizer_mode|"
    r"skip_tokenizer_init)$",
    re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether a key, environment variable or flag name (HF_TOKEN, api-key, --api-key) holds a
    secret; token counts (max_tokens, num_prompt_tokens) do not."""
    n = name.strip("-\"' ").replace("-", "_")
    if not n or _NOT_SECRET.search(n):
        return False
    words = re.split(r"[_.\s]+|(?<=[a-z])(?=[A-Z])", n)
    return any(w.lower() in _SECRET_WORDS for w in words if w) or "apikey" in n.lower()


# --- URLs ---------------------------------------------------------------------------------

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
# the userinfo of a URL: everything up to the last '@' before the path, query or fragment
_USERINFO = re.compile(r"(?<=://)[^/\s?#]*@")


def redact_url(url: str) -> str:
    """`url` with its userinfo and the values of secret-named query parameters hidden:
    `http://alice:pw@h:1/v1?api_key=x&n=2` -> `http://<redacted>@h:1/v1?api_key=<redacted>&n=2`.
    What connects keeps the original; what is stored or shown is this form."""
    url = _USERINFO.sub(f"{REDACTED}@", url, count=1)
    if "?" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.query:
        return url
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if not any(is_secret_name(k) for k, _ in pairs):
        return url
    query = "&".join(
        f"{k}={REDACTED if is_secret_name(k) and v else v}" if "=" in chunk else chunk
        for (k, v), chunk in zip(pairs, parts.query.split("&"), strict=False))
    return urlunsplit(parts._replace(query=query))


# --- free text ----------------------------------------------------------------------------

# `Bearer X`, `Basic X` (an Authorization header's credentials, wherever they stand)
_SCHEME = re.compile(r"\b(?P<scheme>Bearer|Basic|Token|Digest)(?P<sep>\s+)(?P<value>[^\s'\",;]+)",
                     re.IGNORECASE)
_SCHEME_WORDS = frozenset({"bearer", "basic", "token", "digest"})
# `K=V`, `K: V`, `"K": "V"`; candidates at every position (a lookahead), so one pair's match
# never swallows the next pair's name (`run HF_TOKEN=x`, `export OPENAI_API_KEY=x`)
_PAIR = re.compile(
    r"(?=(?<![\w.-])(?P<name>[A-Za-z_][\w.-]*)(?P<sep>['\"]?[ \t]*[=:][ \t]*['\"]?)"
    r"(?P<value>[^\s'\",;&)}\]]+))")
# `--flag value`, `-k value`, `api_key value`: a flag or a compound name, then whitespace
_SPACED = re.compile(
    r"(?=(?<![\w.-])(?P<name>--?[A-Za-z][\w.-]*|[A-Za-z][A-Za-z0-9]*[_-][\w.-]*)"
    r"(?P<sep>[ \t]+)(?P<value>[^\s'\",;)}\]]+))")


def _value_spans(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for m in _SCHEME.finditer(text):
        spans.append(m.span("value"))
    for pattern in (_PAIR, _SPACED):
        for m in pattern.finditer(text):
            value = m.group("value")
            if not is_secret_name(m.group("name")) or value.startswith("-"):
                continue
            if value.lower() in _SCHEME_WORDS or value == REDACTED or "<redacted>" in value:
                continue  # the scheme pass hides the credential that follows
            spans.append(m.span("value"))
    return spans


def redact_text(text: str | None) -> str | None:
    """Free text (a log tail, an error, a launch line) with every secret value hidden (see the
    module docstring); URLs inside it lose their credentials."""
    if not text:
        return text
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    spans = sorted(set(_value_spans(text)))
    if not spans:
        return text
    out: list[str] = []
    pos = 0
    for start, end in spans:
        if start < pos:  # overlapping candidates: the earlier one already covers it
            continue
        out.append(text[pos:start])
        out.append(REDACTED)
        pos = end
    out.append(text[pos:])
    return "".join(out)


# --- structures ---------------------------------------------------------------------------

def _redact_argv(argv: list[Any]) -> list[Any]:
    out: list[Any] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if isinstance(a, str) and a.startswith("-"):
            name, eq, _ = a.partition("=")
            if is_secret_name(name):
                if eq:
                    out.append(f"{name}={REDACTED}")
                else:
                    out.append(a)
                    hide_next = True
                continue
        out.append(redact(a))
    return out


def redact(obj: Any) -> Any:
    """A copy of `obj` with every secret value replaced by "<redacted>": the values of
    secret-named keys at any depth, the argument after a secret-named flag in a list, and
    secrets in strings (see `redact_text`)."""
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                    and not isinstance(v, bool) else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        if any(isinstance(a, str) and a.startswith("-") for a in obj):
            return _redact_argv(list(obj))
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
