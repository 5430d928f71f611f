"""The serving engine: continuous batching over per-slot KV caches, with EAGLE-style MTP
speculative decoding.

One engine thread loops: admit waiting requests into free slots (batched prefill), then one
decode step for every running request. Without speculation a decode step feeds each request's
last token. With speculation (topk 1) it feeds [last, d_1..d_k] for every request in ONE verify
forward, keeps the longest accepted prefix plus one token, then runs the MTP head over the new
positions to draft the next k tokens (the MTP head reused autoregressively for k > 1).
Requests finish by EOS, a stop string, or max_tokens; their slot is freed for the next waiter.

Failures are isolated: a request whose own work fails (its sampling, its stop strings, its
callback) finishes with reason "error" and the others go on; a batched forward that fails ends
the requests of that batch only, and the engine keeps serving. /health reports the engine as
failed only after `UNHEALTHY_AFTER` consecutive failed steps (a broken device, not a bad request).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from collections.abc import Callable

import torch

from servelab.errors import UserError
from servelab.mini.engine import kv_handoff
from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.graphs import GraphRunner
from servelab.mini.engine.kv_budget import check_kv_fits
from servelab.mini.engine.phases import Phases
from servelab.mini.engine.prefix_cache import PrefixCache
from servelab.mini.engine.profiler import StepProfiler, step_name
from servelab.mini.engine.request import FINISH_REASONS, Event, Request, Stats, deliver, generator
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk
from servelab.mini.model.attention import get_backend
from servelab.mini.model.checkpoint import load_model
from servelab.mini.model.model import KVCache

UNHEALTHY_AFTER = 3  # consecutive failed steps before /health reports the engine failed


class Engine(Phases):
    """Owns the model, the KV cache, the prefix cache and the scheduler thread; the batched
    phases of a step are `Phases` (phases.py)."""

    def __init__(self, args: EngineArgs) -> None:
        args.check(cuda_available=torch.cuda.is_available())
        if args.device == "cpu" and args.num_threads:
            torch.set_num_threads(args.num_threads)
        self.args = args
        self.attn_fn = get_backend(args.attention_backend, args.device)
        self.model, self.weights_meta = load_model(args.config, args.weights, args.device,
                                                   args.seed, args.random_weights)
        self.cfg = self.model.cfg
        self.k = args.num_drafts
        self.ctx = args.context_length + self.k + 2
        if self.ctx > self.cfg.max_position:
            raise UserError(f"--context-length {args.context_length} is too long for config "
                            f"{self.cfg.name}: at most {self.cfg.max_position - self.k - 2}")
        dtype = self.model.head.weight.dtype
        check_kv_fits(self.cfg, args, self.ctx, dtype)
        self.cache = KVCache(self.cfg, args.max_running_requests, self.ctx, args.device, dtype)
        self.prefix: PrefixCache | None = None
        if args.radix_cache_blocks:
            self.prefix = PrefixCache(self.cfg, kv_handoff.layers_sent(self.cfg, self.k),
                                      args.page_size, args.radix_cache_blocks, args.device,
                                      dtype, mtp=bool(self.k))
        self.fingerprint = kv_handoff.fingerprint(self.cfg, self.weights_meta, dtype)
        self.device = torch.device(args.device)
        self.stats = Stats(spec_accepted_per_pos=[0] * self.k)
        self.profiler = StepProfiler()
        self.graphs: GraphRunner | None = None
        if args.cuda_graph:
            self.graphs = GraphRunner(self, max_tokens=args.max_running_requests * (self.k + 1))
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._free = list(range(args.max_running_requests - 1, -1, -1))
        self._aborts: set[int] = set()
        self._next_id = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None  # the scheduler loop itself died
        self.failed_steps = 0  # consecutive steps whose batched forward failed
        self.last_failure: str | None = None

    # ---- public API --------------------------------------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams,
               callback: Callable[[Event], None], *, room: int = -1,
               export: Callable[[kv_handoff.KVHandoff], None] | None = None,
               handoff: kv_handoff.KVHandoff | None = None) -> int:
        """Queue a request; `callback` gets an Event per step (from the engine thread).

        Disaggregation: with `export` (a prefill server) the request is prefilled, its KV
        handed to `export`, and it ends after its first token; with `handoff` (a decode
        server) its prompt is not computed: the received KV is installed and decoding goes on."""
        if len(prompt) + params.max_tokens > self.args.context_length:
            raise UserError(f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) "
                            f"exceeds the context length {self.args.context_length}")
        if not prompt:
            raise UserError("empty prompt")
        gen = generator(params)
        with self._cond:
            rid = self._next_id
            self._next_id += 1
            if self.error is not None:  # the engine thread died: answer at once
                callback(Event("", [], "error", len(prompt), 0, 0,
                               f"engine stopped: {self.error!r}"))
                return rid
            self._waiting.append(Request(rid, list(prompt), params, callback, gen, room=room,
                                         export=export, handoff=handoff))
            self._cond.notify()
        return rid

    def check_handoff(self, h: kv_handoff.KVHandoff, prompt: list[int],
                      room: int | None = None) -> None:
        """Refuse (kv_handoff.TransferError) a received handoff this engine cannot continue."""
        kv_handoff.check(h, prompt, room, cfg=self.cfg, k=self.k, dtype=self.cache.kv[0].dtype,
                         model_fingerprint=self.fingerprint)

    def abort(self, rid: int) -> None:
        """Drop a request (client went away); its slot is freed at the next step."""
        with self._cond:
            self._aborts.add(rid)
            self._cond.notify()

    def unhealthy(self) -> str | None:
        """Why the engine cannot serve (None when it can): its loop died, or its last
        `UNHEALTHY_AFTER` steps all failed."""
        if self.error is not None:
            return repr(self.error)
        if self.failed_steps >= UNHEALTHY_AFTER:
            return f"the last {self.failed_steps} steps failed: {self.last_failure}"
        return None

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_cache_usage(self) -> float:
        """The share of the KV cache's token rows that running requests hold (the positions
        written so far), 0..1, as vLLM's `kv_cache_usage_perc` and SGLang's `token_usage`
        count used tokens of the pool. Slots are allocated whole here, so every slot taken
        (num_running at --max-running-requests) can admit no one at a usage below 1; the
        prefix cache's pool is apart (it can be evicted, as vLLM counts cached free blocks)."""
        held = sum(max(r.pos, 0) for r in list(self._running))
        return held / (self.args.max_running_requests * self.ctx)

    def start(self) -> None:
        """Run the scheduler loop in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="mini-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.profiler.stop()

    def warmup(self) -> None:
        """One short request through prefill and decode (and CUDA graph capture) before serving."""
        if self.graphs is not None:
            self.graphs.capture()
        self.generate(tk.encode("warm up"), SamplingParams(max_tokens=4, temperature=0.0,
                                                          ignore_eos=True))
        self.stats = Stats(spec_accepted_per_pos=[0] * self.k)

    def wake(self) -> None:
        """Wake the engine thread (a profiler command is pending)."""
        with self._cond:
            self._cond.notify()

    def generate(self, prompt: list[int], params: SamplingParams) -> tuple[list[int], str, Event]:
        """Synchronous generation (tests, benchmarks): steps in the caller's thread unless the
        engine thread runs. Returns (token ids, text, last event)."""
        events: list[Event] = []
        self.submit(prompt, params, events.append)
        while not events or events[-1].finish_reason is None:
            if self._thread is None:
                self.step()
            else:
                time.sleep(0.001)
        ids = [t for e in events for t in e.token_ids]
        return ids, "".join(e.text for e in events), events[-1]

    # ---- scheduler ---------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._stop or self._waiting or self._running or self._aborts
                               or self.profiler.pending):
                        self._cond.wait()
                    if self._stop:
                        return
                self.profiler.poll()
                self.step()
        except BaseException as exc:  # surfaced by /health; pending requests end with "error"
            self.error = exc
            with self._cond:
                pending = [*self._running, *self._waiting]
                self._running, self._waiting = [], deque()
            for r in pending:
                r.finish = "error"
                deliver(r, Event("", [], "error", len(r.prompt), len(r.out), r.spec_verify_ct,
                                  f"engine stopped: {exc!r}"))
            traceback.print_exc()

    def step(self) -> bool:
        """One scheduler iteration: aborts, admission + prefill, one decode step. True if work."""
        new: list[Request] = []
        with self._cond:
            if self._aborts:
                for r in [*self._running, *self._waiting]:
                    if r.rid in self._aborts:
                        self._finish(r, "abort")
                self._waiting = deque(r for r in self._waiting if r.finish is None)
                self._aborts.clear()
            budget = self.args.max_prefill_tokens
            while self._waiting and self._free and (not new or self._cost(self._waiting[0]) <= budget):
                if new and self._waits_for_prefix(self._waiting[0], new):
                    break
                r = self._waiting.popleft()
                r.slot = self._free.pop()
                if self.prefix is not None and r.handoff is None:
                    r.match = self.prefix.match(r.prompt)
                    r.cached_tokens = r.match.tokens
                budget -= self._cost(r)
                new.append(r)
                self._running.append(r)
        if not self._running:
            return False
        ok = True
        with torch.inference_mode(), self.profiler.step(
                step_name(len(new), len(self._running), bool(self.k))):
            handed = [r for r in new if r.handoff is not None]
            new = [r for r in new if r.handoff is None]
            if handed:
                ok = self._guarded(self._install, handed)
            if new:
                ok = self._guarded(self._prefill, new) and ok
            if self._running:
                ok = self._guarded(self._decode, list(self._running)) and ok
        self.failed_steps = 0 if ok else self.failed_steps + 1
        self.stats.steps += 1
        return True

    def _waits_for_prefix(self, r: Request, admitted: list[Request]) -> bool:
        """Whether `r` should wait one step because a request admitted in this step computes
        the next block `r` would reuse (SGLang's in-batch prefix caching): prompts of one step
        cannot reuse each other's blocks, so a burst sharing a new system prompt would compute
        it in every one of them. Next step `r` is admitted first, reusing it."""
        if self.prefix is None or r.handoff is not None:
            return False
        n = self.prefix.match(r.prompt).tokens + self.prefix.page
        if n > len(r.prompt) - 1:
            return False
        head = r.prompt[:n]
        return any(a.handoff is None and a.prompt[:n] == head for a in admitted)

    def _cost(self, r: Request) -> int:
        """Prefill tokens a request costs: none when its KV came from a prefill server, its
        prompt past the cached prefix otherwise (as matched now: matching has no side effect
        but recency)."""
        if r.handoff is not None:
            return 0
        if r.match.tokens or self.prefix is None:
            return len(r.prompt) - r.match.tokens
        return len(r.prompt) - self.prefix.match(r.prompt).tokens

    def _install(self, reqs: list[Request]) -> None:
        """Decode server: put the received KV in place and emit the prefill's first token."""
        for r in reqs:
            kv_handoff.install(self.cache, r, kv_handoff.layers_sent(self.cfg, self.k), self.k)
            self._append(r, [r.last])

    def _guarded(self, fn: Callable[[list[Request]], None], reqs: list[Request]) -> bool:
        """Run a batched phase; if it fails, the live requests of that batch fail (and only
        they), their slots are freed and the engine goes on. False when it failed."""
        try:
            fn(reqs)
            return True
        except Exception as exc:  # noqa: BLE001 - isolated per batch, reported per request
            self.last_failure = f"{type(exc).__name__}: {str(exc)[:200]}"
            traceback.print_exc()
            for r in reqs:
                if r.finish is None:
                    self._fail(r, self.last_failure)
            return False

    # ---- output ------------------------------------------------------------------------------
    def _append(self, r: Request, toks: list[int]) -> None:
        """Add sampled tokens to a request, detect finish, emit one event."""
        if r.finish is not None:
            return
        text, taken = r.take(toks)
        self.stats.generation_tokens += len(taken)
        if r.finish is not None:
            self._cache_finished(r)
            self._release(r)
        if not deliver(r, Event(text, taken, r.finish, len(r.prompt), len(r.out),
                                 r.spec_verify_ct, cached_tokens=r.cached_tokens)
                       ) and r.finish is None:
            self._fail(r, "its listener failed")

    def _finish(self, r: Request, reason: str, error: str | None = None) -> None:
        r.finish = reason
        self._release(r)
        deliver(r, Event("", [], reason, len(r.prompt), len(r.out), r.spec_verify_ct, error,
                         cached_tokens=r.cached_tokens))

    def _fail(self, r: Request, why: str) -> None:
        """End one request with finish reason "error"; the engine goes on with the others."""
        if r.finish is None:
            with self._cond:
                if r in self._waiting:
                    self._waiting.remove(r)
            self._finish(r, "error", why)

    def _release(self, r: Request) -> None:
        if r.slot >= 0:
            self._free.append(r.slot)
            r.slot = -1
        if r in self._running:
            self._running.remove(r)
        self.stats.finished[r.finish if r.finish in FINISH_REASONS else "error"] += 1
