"""Experiments placed on a Ray cluster: several nodes on 127.0.0.1 (Ray's own test cluster),
each with a custom resource naming its role; real engine processes, real HTTP, real SQLite.

One cluster for the module (starting nodes is the expensive part). The node-loss test runs
last: it removes a node and adds a fresh one with the same resource.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from servelab.errors import UserError  # noqa: E402
from servelab.experiment.plan import check  # noqa: E402
from servelab.experiment.plan.preflight import load  # noqa: E402
from servelab.experiment.report.data import collect  # noqa: E402
from servelab.experiment.run.measure import bench_measure  # noqa: E402
from servelab.experiment.run.runner import Runner  # noqa: E402
from servelab.store import Store  # noqa: E402

ROUTER = Path(__file__).with_name("tiny_router.py")
SRC = str(Path(__file__).resolve().parents[3] / "src")
NODE_ARGS = {"num_cpus": 1, "object_store_memory": 75 * 1024 * 1024, "include_dashboard": False}
# Ray names a node by the machine's outward address; its switch for single-machine clusters
# keeps every node (and so every engine it places) on loopback
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.fixture(scope="module")
def cluster():
    """Head (the router's node) + a prefill node + a decode node with two (declared) GPUs,
    the driver joined to it."""
    from ray._private import ray_constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # read at import: this process
        for k, v in LOOPBACK.items():  # the nodes' processes and the runner's
            mp.setenv(k, v)
        mp.setenv("PYTHONPATH", os.pathsep.join(  # the nodes' workers import servelab
            p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
        c = Cluster(initialize_head=True,
                    head_node_args={**NODE_ARGS, "resources": {"node:router": 1}})
        nodes = {"router": c.head_node}
        for role in ("prefill", "decode"):  # the decode node declares 2 GPUs (ids only)
            nodes[role] = c.add_node(**NODE_ARGS, resources={f"node:{role}": 1},
                                     labels={"tier": role}, num_gpus=2 * (role == "decode"))
        ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
        try:
            yield c, nodes
        finally:
            ray.shutdown()
            c.shutdown()


def settled(timeout_s: float = 20.0) -> None:
    """Wait until every node's resources are free again (a removed actor's are released a
    moment after it dies): --check predicts from the free resources of the moment."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        total, free = ray.cluster_resources(), ray.available_resources()
        if all(free.get(k, 0) >= v for k, v in total.items() if k.startswith(("node:", "GPU"))):
            return
        time.sleep(0.1)
    raise AssertionError(f"resources still held: {ray.available_resources()}")


def node_id_with(resource: str) -> str:
    (nid,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
    return nid


def pd_toml(name: str, marker: str, *, arms: str, address: str | None = None,
            gap_ms: float = 4, prompts: int = 4, reps: int = 2) -> str:
    """prefill, decode and router each on its own node (scripted servers): prefill and router
    by a custom resource, decode by a node label."""
    srv = [sys.executable, "-m", "servelab.bench.scripted", "--host", "{host}",
           "--port", "{port}", "--model", marker, "--no-log"]
    rtr = [sys.executable, str(ROUTER), "{port}", "{prefill_url}", "{decode_url}", marker]
    addr = f'ray_address = "{address}"' if address else ""
    return f"""
name = "{name}"
engine = "command"
placement = "ray"
{addr}
repetitions = {reps}
restart = "run"
retries = 0
[[base.processes]]
role = "prefill"
command = {srv!r}
resources = {{ "node:prefill" = 1 }}
flags = {{ ttft-ms = 5, gap-ms = 40 }}
[[base.processes]]
role = "decode"
command = {srv!r}
node_labels = {{ tier = "decode" }}
flags = {{ ttft-ms = 5, gap-ms = {gap_ms} }}
[[base.processes]]
role = "router"
command = {rtr!r}
resources = {{ "node:router" = 1 }}
{arms}
[load]
concurrency = [2]
[workload]
input_len = 8
output_len = 9
num_prompts = {prompts}
[timeouts]
ready_s = 60
teardown_s = 5
""".replace("'", '"')


TWO_ARMS = """
[arms.base]
[arms.fast-decode]
roles = ["decode"]
flags = { tokens-per-chunk = 2 }
"""


EMBEDDED_PD = Path(__file__).resolve().parents[3] / "examples" / "disagg_embedded.toml"


def embedded_pd_toml(marker: str) -> str:
    """examples/disagg_embedded.toml placed on the cluster, shortened: both arms of a block up
    at once (restart = "block"), so each node holds two processes (half its resource each).
    `marker` is in the servers' command lines (their served model name)."""
    text = EMBEDDED_PD.read_text()
    for old, new in (
        ("num-threads = 1", f'num-threads = 1\nserved-model-name = "{marker}"'),
        ('restart = "block"', 'restart = "block"\nplacement = "ray"\nretries = 0'),
        ("repetitions = 3", "repetitions = 2"), ("concurrency = [1, 4]", "concurrency = [2]"),
        ("num_prompts = 16", "num_prompts = 4"), ("output_len = 32", "output_len = 8"),
        ("warmup = 2", "warmup = 0"),
        ('role = "prefill"', 'role = "prefill"\nresources = { "node:prefill" = 0.5 }'),
        ('role = "decode"', 'role = "decode"\nnode_labels = { tier = "decode" }'),
        ('role = "router"', 'role = "router"\nresources = { "node:router" = 0.5 }'),
    ):
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def test_embedded_pd_on_three_nodes_runs_interleaved_arms_to_a_verdict(
        cluster, tmp_path, live_procs):
    marker = f"rayemb-{uuid.uuid4().hex[:8]}"
    f = tmp_path / "pd.toml"
    f.write_text(embedded_pd_toml(marker))
    spec = load(f)
    store = Store(tmp_path / "r.db")
    res = Runner(spec, store, say=lambda s: None, log_root=tmp_path / "logs").run()
    assert (res.ok, res.failed) == (4, 0)
    runs = store.runs(spec.name)
    assert sorted((r.block, r.arm) for r in runs) == [
        (0, "baseline"), (0, "mtp"), (1, "baseline"), (1, "mtp")]
    eff = collect(store, spec.name).analysis.effects[("mtp", "c=2", "output_throughput_tok_s")]
    assert eff.paired and eff.verdict in ("better", "worse", "within noise")
    for r in runs:
        lp = store.load_point(r.load_point_id)
        procs = lp.provenance["processes"]
        assert [p["role"] for p in procs] == ["prefill", "decode", "router"]
        for p in procs:  # each process ran on the node holding its role
            assert p["node"]["node_id"] == node_id_with(f"node:{p['role']}")
        # the router got the prefill's URL and bootstrap port found on the prefill node
        pre = procs[0]["argv"]
        boot = pre[pre.index("--disaggregation-bootstrap-port") + 1]
        port = pre[pre.index("--port") + 1]
        assert f"--prefill http://127.0.0.1:{port} {boot} --decode" in " ".join(procs[2]["argv"])
        if r.arm == "mtp":  # the arm's delta reached the decode node: it speculated
            assert lp.summary["accept_length"] > 1.0
    logs = sorted((tmp_path / "logs").rglob("1-decode.log"))  # copied back from the node
    assert len(logs) == 4 and "# on node 127.0.0.1" in logs[0].read_text()
    assert live_procs(marker) == []


def test_check_shows_the_node_per_process_and_refuses_an_unplaceable_plan(
        cluster, tmp_path, monkeypatch, capsys):
    from cli_inproc import cli

    f = tmp_path / "pd.toml"
    f.write_text(pd_toml("raycheck", "m", arms=TWO_ARMS))
    settled()
    code, out, _ = cli(monkeypatch, capsys, "run", str(f), "--check", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["schema"].startswith("servelab.experiment_check/")
    for procs in data["arms"].values():
        for p in procs:
            assert p["node"]["node_id"] == node_id_with(f"node:{p['role']}")
            assert p["node"]["candidates"] == 1
            assert "127.0.0.1" in " ".join(p["argv"])  # the node's address
    code, out, _ = cli(monkeypatch, capsys, "run", str(f), "--check")
    assert code == 0 and f"on Ray node 127.0.0.1 ({node_id_with('node:decode')[:8]})" in out
    # no node has 4 GPUs: refused with the process, what it asks and what the cluster has
    f.write_text(pd_toml("raycheck", "m", arms=TWO_ARMS).replace(
        'node_labels = { tier = "decode" }', 'node_labels = { tier = "decode" }\nnum_gpus = 4'))
    with pytest.raises(UserError) as err:
        check.collect(load(f), "pd.toml")
    msg = str(err.value)
    assert msg.startswith("pd.toml: arms.base (decode): no node of the Ray cluster can hold the "
                          "decode process: it asks GPU=4, label tier=decode; the cluster has node ")
    assert "CPU=1, GPU=2, node:127.0.0.1=1, node:decode=1, label tier=decode" in msg
    assert "\n" not in msg
    # each fits alone, but restart = "block" keeps both arms' decode servers up at once
    f.write_text(pd_toml("raycheck", "m", arms=TWO_ARMS).replace(
        'restart = "run"', 'restart = "block"'))
    with pytest.raises(UserError, match=r"arms.fast-decode \(prefill\): no node has room for it"):
        check.collect(load(f))


def _ctrl_c_default() -> None:
    """In the child before exec: SIGINT at its default, as for a program started in the
    foreground (a test run started as a shell's background job inherits it ignored, and the
    runner would never see the Ctrl-C this test sends)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_the_runner_stopped_leaves_no_engine_on_any_node(cluster, tmp_path, live_procs, sig):
    """Ctrl-C: the runner tears the nodes' engines down itself and exits 130; kill -9: Ray
    ends the dead driver's actors, and the engines end with them."""
    c, _ = cluster
    marker = f"raystop-{uuid.uuid4().hex[:8]}"
    f = tmp_path / "stop.toml"
    f.write_text(pd_toml("raystop", marker, arms=TWO_ARMS, address=c.address, gap_ms=200,
                         prompts=200, reps=1))
    runner = subprocess.Popen(
        [sys.executable, "-m", "servelab", "run", str(f), "--store", str(tmp_path / "r.db")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_ctrl_c_default,
        env={**os.environ, "SERVELAB_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"})
    try:
        seen = []
        for line in runner.stdout:  # the first arm deployed on its three nodes
            seen.append(line)
            if "deployed arm" in line:
                break
        assert len(live_procs(marker)) == 3, "".join(seen)
    finally:
        runner.send_signal(sig)
        try:
            out, _ = runner.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # say where it hung
            runner.kill()
            out, _ = runner.communicate()
            pytest.fail(f"the runner did not exit within 60 s of {sig.name}; its output:\n"
                        + "".join(seen)[-1500:] + out[-3000:])
    if sig == signal.SIGINT:  # torn down before the runner exited
        assert runner.returncode == 130 and "no engine left running" in out, out[-2000:]
        assert live_procs(marker) == []
    deadline = time.monotonic() + 20
    while live_procs(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_procs(marker) == []


def test_a_node_lost_mid_run_fails_that_run_and_a_rerun_resumes_the_rest(
        cluster, tmp_path, live_procs):
    c, nodes = cluster
    marker = f"raylost-{uuid.uuid4().hex[:8]}"
    srv = [sys.executable, "-m", "servelab.bench.scripted", "--host", "{host}",
           "--port", "{port}", "--model", marker, "--no-log"]
    f = tmp_path / "lost.toml"
    f.write_text(f"""
name = "raylost"
engine = "command"
placement = "ray"
repetitions = 1
retries = 0
[[base.processes]]
role = "server"
command = {srv!r}
resources = {{ "node:decode" = 1 }}
num_gpus = 1
flags = {{ ttft-ms = 5, gap-ms = 20 }}
[arms.a]
[arms.b]
flags = {{ tokens-per-chunk = 2 }}
[load]
concurrency = [2]
[workload]
input_len = 8
output_len = 9
num_prompts = 6
[timeouts]
ready_s = 30
teardown_s = 5
""".replace("'", '"'))
    spec = load(f)
    lost_id = node_id_with("node:decode")

    seen_gpus = []

    def measure(url, s, run):
        (pid,) = live_procs(marker)
        env = dict(kv.split("=", 1) for kv in
                   Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        seen_gpus.append(env.get("CUDA_VISIBLE_DEVICES"))
        if run.seq == 1:  # the decode node goes away while the second run measures
            c.remove_node(nodes["decode"])
        return bench_measure(url, s, run)

    store = Store(tmp_path / "r.db")
    res = Runner(spec, store, measure=measure, say=lambda s: None).run()
    assert (res.ok, res.failed) == (1, 1)
    # the engine saw exactly the GPU Ray gave its actor, and provenance says which
    prov = store.load_point(store.runs("raylost")[0].load_point_id).provenance["processes"][0]
    assert seen_gpus[0] in ("0", "1") and prov["env"]["CUDA_VISIBLE_DEVICES"] == seen_gpus[0]
    assert prov["node"]["gpus"] == [seen_gpus[0]]
    failed = [r for r in store.runs("raylost") if r.status == "failed"]
    assert len(failed) == 1 and failed[0].arm == "b"
    assert failed[0].error.startswith(f"during the run: node 127.0.0.1 ({lost_id[:8]}) of the "
                                      "server process died"), failed[0].error
    nodes["decode"] = c.add_node(**NODE_ARGS, resources={"node:decode": 1},
                                 labels={"tier": "decode"}, num_gpus=2)
    said: list[str] = []
    res = Runner(spec, store, say=said.append).run()
    assert (res.ok, res.failed, res.already_done) == (1, 0, 1)
    assert "1 of 2 runs already stored, 1 to run (1 failed earlier, retried)" in said[0]
    runs = store.runs("raylost")
    assert sorted((r.arm, r.status) for r in runs) == [("a", "ok"), ("b", "ok")]  # no duplicate
    prov = store.load_point(runs[-1].load_point_id).provenance["processes"][0]["node"]
    assert prov["node_id"] == node_id_with("node:decode") != lost_id
