"""`servelab router`'s flags (router/args.py), as sglang_router spells them; one-line errors
for bad ones."""

from __future__ import annotations

import pytest

from servelab.errors import UserError
from servelab.mini.router.args import parse


def test_router_flags_parse_as_sglang_router_spells_them():
    cfg, host, port = parse(["--pd-disaggregation", "--prefill", "http://10.0.0.1:30000", "8998",
                             "--prefill", "http://10.0.0.2:30000", "none", "--prefill",
                             "http://10.0.0.3:30000", "--decode", "http://10.0.0.4:30001",
                             "--host", "0.0.0.0", "--port", "8000", "--policy", "random"])
    assert [(p.url, p.bootstrap_port) for p in cfg.prefills] == [
        ("http://10.0.0.1:30000", 8998), ("http://10.0.0.2:30000", None),
        ("http://10.0.0.3:30000", None)]
    assert cfg.decodes == ("http://10.0.0.4:30001",) and cfg.policy == "random"
    assert (host, port) == ("0.0.0.0", 8000)
    for argv, why in (([], "--pd-disaggregation"),
                      (["--pd-disaggregation", "--decode", "http://a:1"], "at least one --prefill"),
                      (["--pd-disaggregation", "--prefill", "a:1", "--decode", "http://a:1"],
                       "worker URL"),
                      (["--pd-disaggregation", "--prefill", "http://a:1", "0", "--decode",
                        "http://a:2"], "bootstrap port '0'"),
                      (["--pd-disaggregation", "--prefill", "http://a:1", "--decode",
                        "http://a:2", "--policy", "cache_aware"], "knows round_robin"),
                      *(([*"--pd-disaggregation --prefill".split(), bad, "--decode",
                          "http://a:2"], "worker URL")
                        for bad in ("http://a:99999", "http://a:x", "http://[::1", "http://a:0")),
                      *(([*"--pd-disaggregation --prefill http://a:1 --decode http://a:2".split(),
                          "--request-timeout-secs", t], "must be > 0")
                        for t in ("inf", "nan", "0", "-1"))):
        with pytest.raises(UserError, match=why):
            parse(argv)
