"""The ws split kernel's phase trace (gluon_ws.launch(trace=...); read by
benchmarks/bench_sparse_mla_probes.py split-trace): the layout of a program's row, and the
jit helpers that stamp it."""

from __future__ import annotations

from .common import AVAILABLE

# Per program one row of TRACE_COLS int64, column -> what. Globaltimer stamps (ns) but "sm"; the
# per-tile columns hold the first TRACE_TILES tiles (later tiles are not stamped); unstamped
# entries keep what the caller put there.
TRACE_TILES = 16
TRACE_LAYOUT = {
    "sm": 0,  # %smid
    "entry": 1,  # kernel entry (before q's copies are issued)
    "q": 2,  # scorer: q landed
    "idx0": 3,  # loader: the first tile's indices in registers
    "scorer_end": 4,  # scorer: after its last P V
    "scorer_stored": 5,  # scorer: its half of O and lse stores issued
    "second_end": 6,  # second half: the scorer's `done` seen
    "second_stored": 7,  # second half: its stores issued
    "loader_end": 8,
    "landed": 16,  # + j: loader: tile j's copies landed (k_ready)
    "ready": 32,  # + j: scorer: k_ready of tile j seen
    "scored": 48,  # + j: scorer: S of tile j in registers
    "pv1": 64,  # + j: scorer: its P V of tile j done
    "p_ready": 80,  # + j: second half: P of tile j seen
    "pv2": 96,  # + j: second half: its P V of tile j done
}
TRACE_COLS = 112

if AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    T_SM = gl.constexpr(TRACE_LAYOUT["sm"])
    T_ENTRY = gl.constexpr(TRACE_LAYOUT["entry"])
    T_Q = gl.constexpr(TRACE_LAYOUT["q"])
    T_IDX0 = gl.constexpr(TRACE_LAYOUT["idx0"])
    T_SCORER_END = gl.constexpr(TRACE_LAYOUT["scorer_end"])
    T_SCORER_STORED = gl.constexpr(TRACE_LAYOUT["scorer_stored"])
    T_SECOND_END = gl.constexpr(TRACE_LAYOUT["second_end"])
    T_SECOND_STORED = gl.constexpr(TRACE_LAYOUT["second_stored"])
    T_LOADER_END = gl.constexpr(TRACE_LAYOUT["loader_end"])
    T_LANDED = gl.constexpr(TRACE_LAYOUT["landed"])
    T_READY = gl.constexpr(TRACE_LAYOUT["ready"])
    T_SCORED = gl.constexpr(TRACE_LAYOUT["scored"])
    T_PV1 = gl.constexpr(TRACE_LAYOUT["pv1"])
    T_P_READY = gl.constexpr(TRACE_LAYOUT["p_ready"])
    T_PV2 = gl.constexpr(TRACE_LAYOUT["pv2"])
    T_TILES = gl.constexpr(TRACE_TILES)
    T_COLS = gl.constexpr(TRACE_COLS)

    @gluon.jit
    def _now():
        """The GPU's global nanosecond timer (the same clock on every SM)."""
        return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                         is_pure=False, pack=1)  # fmt: skip

    @gluon.jit
    def _stamp(tr, col, TRACE: gl.constexpr, ok=True):
        """TRACE: the timer into column `col` of this program's trace row (if ok)."""
        if TRACE:
            gl.store(tr + col, _now(), mask=ok)
