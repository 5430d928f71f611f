"""The datasets a load point can send, each building the records of servelab.bench.workload:

- `random` (synthetic.py): prompts of exact lengths, unique so that no cache hits;
- `sharegpt` (sharegpt.py): first turns of ShareGPT-format conversations;
- `trace` (trace.py reads Mooncake/Bailian JSONL, Azure and BurstGPT CSV; blocks.py turns the
  rows into prompts whose shared hash_id blocks are identical text): requests due on the file's
  clock;
- `generated-shared-prefix` (shared_prefix.py): G groups x P prompts sharing a system prompt;
- multi-turn sessions (sessions.py; `sessions` set, random or sharegpt): the planned turns of
  each session, which servelab.bench.sessions sends with their history.

text.py fits a prompt to an exact token count; every dataset uses it.
"""

from __future__ import annotations

import random
from dataclasses import replace

from servelab.bench.config import WorkloadConfig
from servelab.bench.datasets.blocks import trace_specs
from servelab.bench.datasets.sessions import session_specs
from servelab.bench.datasets.shared_prefix import SharedPrefix, shared_prefix_specs
from servelab.bench.datasets.sharegpt import sharegpt_specs
from servelab.bench.datasets.synthetic import random_like, random_specs
from servelab.bench.datasets.text import counter
from servelab.bench.datasets.trace import BLOCK_SIZE, read_window
from servelab.bench.workload import CountFn, RequestSpec, Workload


async def build_workload(cfg: WorkloadConfig, warmup: int, remote_count: CountFn | None,
                         concurrency: int = 32) -> Workload:
    """The request specs of a run: the dataset's measured requests plus `warmup` more, shaped
    like the measured ones but sharing none of their text, so they warm the server into the
    measured load's state without filling its prefix cache with the measured prefixes:
    shared-prefix groups warm up with groups of their own (same group count, sizes and
    lengths, other system prompts); a trace's, sessions' and a ShareGPT file too short to
    give prompts apart from the measured ones warm up with unique random prompts whose input
    and output lengths are drawn from the measured ones'."""
    count, source = counter(remote_count, cfg.tokenizer)
    rng = random.Random(cfg.seed)
    info: dict | None = None
    kind = cfg.kind
    measured: list[RequestSpec]
    if cfg.sessions is not None:
        ss = cfg.sessions
        measured = await session_specs(ss, cfg.input_len, cfg.output_len,
                                       cfg.dataset if kind == "sharegpt" else None, rng, count,
                                       concurrency)
        info = {"num_sessions": ss.num_sessions, "session_turns_planned": len(measured),
                "turns": ss.turns if kind == "random" else None, "max_turns": ss.max_turns,
                "think_time": str(ss.think_time)}
    elif kind == "random":
        specs = await random_specs(cfg.input_len, cfg.output_len, cfg.num_prompts + warmup, rng,
                                   count, concurrency)
        # warmup requests come last in the draw so that measured prompts do not depend on --warmup
        return Workload(tuple(specs[: cfg.num_prompts]), tuple(specs[cfg.num_prompts:]), source)
    elif kind == "sharegpt":
        assert cfg.dataset is not None
        specs = await sharegpt_specs(cfg.dataset, cfg.num_prompts + warmup, rng, count, concurrency)
        measured, warm = specs[: cfg.num_prompts], specs[cfg.num_prompts:]
        if {s.prompt for s in warm} & {s.prompt for s in measured}:
            # the file is too short and cycles: a warm-up prompt would be a measured one, which
            # a prefix cache then serves; random prompts of the measured lengths instead
            warm = await random_like(measured, warmup, random.Random(cfg.seed + 0x5EED), count,
                                     concurrency, first=len(measured))
        return Workload(tuple(measured), tuple(warm), source)
    elif kind == "trace":
        assert cfg.dataset is not None
        win = read_window(cfg.dataset, cfg.trace_format, cfg.trace_start_s, cfg.trace_duration_s,
                          cfg.trace_speed, cfg.num_prompts)
        block = cfg.trace_block_size or BLOCK_SIZE.get(win.format, 512)
        measured = await trace_specs(win, block, cfg.seed, count, concurrency)
        span = win.arrivals_s[-1] if win.arrivals_s else 0.0
        info = {"trace_format": win.format, "trace_rows": len(win.rows),
                "trace_rows_read": win.read, "trace_rows_skipped": win.skipped,
                "trace_block_size": block if any(r.hash_ids for r in win.rows) else None,
                "trace_span_s": span, "trace_speed": cfg.trace_speed,
                "trace_start_s": cfg.trace_start_s, "trace_duration_s": cfg.trace_duration_s}
    else:
        g = SharedPrefix(cfg.gsp_num_groups, cfg.gsp_prompts_per_group, cfg.gsp_system_prompt_len,
                         cfg.gsp_question_len, cfg.gsp_output_len)
        measured = await shared_prefix_specs(g, rng, count, concurrency)
        info = {"gsp_num_groups": g.num_groups, "gsp_prompts_per_group": g.prompts_per_group,
                "gsp_system_prompt_len": g.system_prompt_len, "gsp_question_len": g.question_len,
                "gsp_output_len": g.output_len}
        warm = await warm_groups(g, warmup, cfg.seed, count, concurrency, first=len(measured))
        return Workload(tuple(measured), tuple(warm), source, info)
    wrng = random.Random(cfg.seed + 0x5EED)
    warm = (await random_like(measured, warmup, wrng, count, concurrency, first=len(measured))
            if measured else
            await random_specs(cfg.input_len, cfg.output_len, warmup, wrng, count, concurrency))
    return Workload(tuple(measured), tuple(warm), source, info)


async def warm_groups(g: SharedPrefix, n: int, seed: int, count: CountFn | None,
                      concurrency: int, first: int) -> list[RequestSpec]:
    """`n` warm-up requests of shared-prefix groups shaped as `g` (other system prompts and
    questions: further sets of G x P from seeds apart from the measured set's), indices from
    `first`."""
    out: list[RequestSpec] = []
    k = 0
    while len(out) < n:
        out += await shared_prefix_specs(g, random.Random(seed + 0x5EED + k), count, concurrency)
        k += 1
    return [replace(s, index=first + i) for i, s in enumerate(out[:n])]


__all__ = ["build_workload"]
