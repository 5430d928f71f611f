"""The redaction policy (servelab.redaction): generated secrets in every place a flag, an
environment, a URL, an argument list or free text can hold them never survive it, and what holds
no secret (token counts, plain URLs, prose) passes unchanged."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.redaction import (
    REDACTED,
    is_secret_name,
    redact,
    redact_text,
    redact_url,
)

# secrets as engines and clouds issue them: a prefix and 12-40 characters of a URL-safe alphabet
# "Q7" makes every secret a string no template around it contains ("Authorizatio" was one)
SECRET = st.builds(
    lambda prefix, body: prefix + "Q7" + body,
    st.sampled_from(["sk-", "hf_", "AKIA", "ghp_", "xoxb-", "", "pw"]),
    st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789_-", min_size=12,
            max_size=40).filter(lambda s: not s.startswith("-")))
FLAG_NAMES = st.sampled_from(["api-key", "hf-token", "password", "admin-api-key", "auth-token",
                              "secret", "db-password", "client_secret", "access-token"])
ENV_NAMES = st.sampled_from(["HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "API_KEY",
                             "GITHUB_TOKEN", "DB_PASSWORD", "SERVELAB_API_KEY", "hf_token"])


def _places(secret: str, flag: str, env: str) -> list[object]:
    """Every form a secret can take in what servelab stores or prints."""
    return [
        {"flags": {flag: secret, "tp": 1}, "env": {env: secret, "NCCL_PROTO": "LL"}},
        {"arms": {"b": {"flags": {flag: secret}, "env": {env: secret}}}},
        ["python", "-m", "x", f"--{flag}", secret, "--port", "1"],
        ["python", f"--{flag}={secret}"],
        f"$ python -m sglang.launch_server --{flag} {secret} --port 30000",
        f"run {env}={secret} now",
        f"export {env}={secret}",
        f"a b c {env}={secret}",
        f"Authorization: Bearer {secret}",
        f"curl -H 'Authorization: Bearer {secret}' http://h",
        f'{{"{env}": "{secret}", "n": 1}}',
        f"http://alice:{secret}@host:8000/v1",
        f"http://{secret}@host:8000/v1",
        f"postgres://user:{secret}@db.internal:5432/app",
        f"http://host:8000/v1?{flag.replace('-', '_')}={secret}&n=2",
        {"DATABASE_URL": f"postgres://u:{secret}@db/app"},
        {"base_url": f"https://u:{secret}@api.example/v1"},
        f"error: connect to https://bob:{secret}@x.example failed",
    ]


@settings(max_examples=250, deadline=None)
@given(secret=SECRET, flag=FLAG_NAMES, env=ENV_NAMES)
def test_no_generated_secret_survives_in_any_place(secret, flag, env):
    for place in _places(secret, flag, env):
        out = redact_text(place) if isinstance(place, str) else redact(place)
        dumped = json.dumps(out)
        assert secret not in dumped, f"{secret!r} survived in {dumped}"
        assert REDACTED in dumped


def test_the_forms_the_first_policy_missed():
    # a K=V after an odd-position word, the Bearer credential, export, --flag value in one string
    assert redact_text("a run HF_TOKEN=x1y2z3") == f"a run HF_TOKEN={REDACTED}"
    assert redact_text("Authorization: Bearer abc.def") == f"Authorization: Bearer {REDACTED}"
    assert redact_text("export OPENAI_API_KEY=sk-1") == f"export OPENAI_API_KEY={REDACTED}"
    assert redact(["--x", "1", "cmd --api-key sk-X"]) == ["--x", "1", f"cmd --api-key {REDACTED}"]
    assert redact({"cmd": "serve --api-key sk-X --port 1"}) == {
        "cmd": f"serve --api-key {REDACTED} --port 1"}


def test_urls_keep_what_is_not_secret():
    assert redact_url("http://127.0.0.1:30000/v1") == "http://127.0.0.1:30000/v1"
    assert redact_url("http://a:b@h:1/v1?api_key=k&n=2&x") == (
        f"http://{REDACTED}@h:1/v1?api_key={REDACTED}&n=2&x")
    assert redact_url("http://h/p?model=m&max_tokens=5") == "http://h/p?model=m&max_tokens=5"


def test_what_holds_no_secret_passes_unchanged():
    text = ("max_tokens=128 num_prompt_tokens: 40 --max-total-tokens 4096 tokenizer_path=/m "
            "the key cache keeps tokens; ttft_ms=5 --port 30000 key: value")
    assert redact_text(text) == text
    spec = {"flags": {"max-running-requests": 1, "disable-auth": True, "page-size": 64},
            "env": {"NCCL_PROTO": "LL"}, "workload": {"output_len": 32}}
    assert redact(spec) == spec
    for name in ("max_tokens", "num_prompt_tokens", "tokenizer", "sort_key", "input_tokens"):
        assert not is_secret_name(name), name
    for name in ("HF_TOKEN", "--api-key", "apiKey", "AWS_SECRET_ACCESS_KEY", "Authorization"):
        assert is_secret_name(name), name
