"""Work and minimum memory traffic of one sparse MLA decode call, for roofline percentages.

Plain integer arithmetic: benchmarks and the profiler's roofline read them without a GPU.
"""

from __future__ import annotations


def flops(batch: int, heads: int, topk: int, d_qk: int, d_v: int) -> int:
    """Matmul FLOPs of one call: per request, head and slot a d_qk dot (scores) and a d_v
    axpy (P V), 2 FLOPs per multiply-add: 2 B H topk (d_qk + d_v). Softmax is not counted
    (O(B H topk), under 0.2% at the real shapes)."""
    return 2 * batch * heads * topk * (d_qk + d_v)


def bytes(  # noqa: A001 - the public name the kernel's roofline code expects
    batch: int,
    heads: int,
    topk: int,
    d_qk: int,
    d_v: int,
    *,
    kv_bytes_per_token: int | None = None,
    elem_bytes: int = 2,
) -> int:
    """Fewest bytes one call must move through device memory: each request's selected KV
    rows once (``kv_bytes_per_token``, default d_qk x elem_bytes; 656/584 for the FP8
    layouts), q read and out written once, lse (fp32) written, indices (int32) read.
    Re-reads of a row by several head blocks or splits are not counted (L2 may absorb them)."""
    per_token = d_qk * elem_bytes if kv_bytes_per_token is None else kv_bytes_per_token
    kv = batch * topk * per_token
    q = batch * heads * d_qk * elem_bytes
    o = batch * heads * d_v * elem_bytes
    lse = batch * heads * 4
    idx = batch * topk * 4
    return kv + q + o + lse + idx
