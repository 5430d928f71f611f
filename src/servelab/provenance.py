"""Provenance attached to every result: who measured what, where, with which software.

Secrets never reach the store: `redact` replaces the value of every key that names a secret
(token, key, secret, password, credential, auth, cookie, ...: HF_TOKEN, api_key, OPENAI_API_KEY,
AWS_SECRET_ACCESS_KEY) and of every command-line flag so named (`--api-key X`,
`--hf-token=X`), at any depth, and credentials written into URLs (`https://user:pw@host`).
`collect` applies it, and the store applies it again to whatever provenance it is given.
"""

from __future__ import annotations

import functools
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servelab import __version__


@functools.cache
def git_sha() -> str | None:
    """The servelab checkout's commit (with '-dirty' when modified), or None outside a checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) or None


@functools.cache
def gpus() -> list[dict[str, str]] | None:
    """GPU name, driver and memory from nvidia-smi; None where there is none."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    return [{"name": r[0], "driver": r[1], "memory": r[2]} for r in rows if len(r) >= 3] or None


REDACTED = "<redacted>"
# a name is secret when one of its words (split at _ - . and case changes) is one of these
_SECRET_WORDS = frozenset({
    "token", "tokens", "key", "apikey", "secret", "secrets", "password", "passwd", "pwd",
    "passphrase", "credential", "credentials", "auth", "authorization", "cookie", "session",
    "signature", "private", "bearer",
})
# names that contain a secret word but hold no secret (counts and sizes of tokens, sort keys)
_NOT_SECRET = re.compile(
    r"(^|_)(max|min|num|total|input|output|prompt|completion|draft|accepted|generation|new|"
    r"special|sort|primary|load|cache|spec|eos|bos)_?([a-z0-9]+_){0,3}(tokens?|keys?)($|_)"
    r"|tokens?_(per|s$|count)"
    r"|^(key|keys|tokens|token_ids|token_strs|load_key|tokenizer|tokenizer_path|tokenizer_mode|skip_tokenizer_init)$",
    re.IGNORECASE)
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]+@")


def is_secret_name(name: str) -> bool:
    """Whether a key, environment variable or flag name (HF_TOKEN, api-key, --api-key) holds a
    secret; token counts (max_tokens, num_prompt_tokens) do not."""
    n = name.lstrip("-").replace("-", "_")
    if _NOT_SECRET.search(n):
        return False
    words = re.split(r"[_.\s]+|(?<=[a-z])(?=[A-Z])", n)
    return any(w.lower() in _SECRET_WORDS for w in words if w) or "apikey" in n.lower()


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
        out.append(_URL_CREDENTIALS.sub(f"{REDACTED}@", a) if isinstance(a, str) else redact(a))
    return out


def redact(obj: Any) -> Any:
    """A copy of `obj` with secret values replaced by "<redacted>" (see the module docstring)."""
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                    else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        if any(isinstance(a, str) and a.startswith("--") for a in obj):
            return _redact_argv(list(obj))
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return _URL_CREDENTIALS.sub(f"{REDACTED}@", obj)
    return obj


def collect(**extra: Any) -> dict[str, Any]:
    """The provenance of a measurement made now; `extra` adds (e.g. server_info, workload seed)."""
    prov: dict[str, Any] = {
        "servelab_version": __version__,
        "git_sha": git_sha(),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "time_unix": time.time(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpus": gpus(),
    }
    prov.update(extra)
    return redact(prov)


_TEXT_SECRET = re.compile(
    r"(?P<name>[A-Za-z][A-Za-z0-9_.-]*)(?P<sep>['\"]?\s*[=:]\s*['\"]?|\s+)(?P<value>[^\s'\",)}\]]+)")


def redact_text(text: str | None) -> str | None:
    """Free text (a log tail, an error) with the values after secret names hidden:
    `HF_TOKEN=hf_x`, `--api-key sk-1`, `api_key='sk-1'` and URL credentials."""
    if not text:
        return text

    def hide(m: re.Match[str]) -> str:
        if not is_secret_name(m.group("name")):
            return m.group(0)
        return f"{m.group('name')}{m.group('sep')}{REDACTED}"

    return _URL_CREDENTIALS.sub(f"{REDACTED}@", _TEXT_SECRET.sub(hide, text))
