"""`servelab profile` puts every sparse-MLA kernel (Triton and Gluon) in the attention category."""

from __future__ import annotations

import pytest
from mla_check import (
    interpreted_kernels,
)

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")

assert interpreted_kernels  # the module-scoped autouse fixture, imported to take effect here


def test_kernel_names_read_as_attention_in_a_profile():
    """`servelab profile` must put our own kernels in the attention category, not 'other' or
    'communication' (a name like `_combine_kernel` matches the all-to-all combine rule)."""
    from servelab.kernels.sparse_mla import naive
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import fp8 as gluon_fp8
    from servelab.kernels.sparse_mla.gluon_kernels import nh as gluon_nh
    from servelab.kernels.sparse_mla.gluon_kernels import ws as gluon_ws
    from servelab.kernels.sparse_mla.splitkv import merge
    from servelab.kernels.sparse_mla.triton_kernels import fp8_chunked as triton_fp8
    from servelab.kernels.sparse_mla.triton_kernels import rp as triton_rp
    from servelab.kernels.sparse_mla.triton_kernels import split as triton_split
    from servelab.profile.breakdown import load_rules

    rules = load_rules()
    kernels = [naive._sparse_mla_naive_kernel, triton_split._sparse_mla_split_kernel,
               merge._sparse_mla_merge_kernel, triton_fp8._sparse_mla_split_fp8_kernel,
               triton_rp._sparse_mla_split_rp_kernel]
    if gluon_common.AVAILABLE:
        kernels += [gluon_ws._sparse_mla_split_gluon_ws_kernel,
                    gluon_fp8._sparse_mla_split_gluon_fp8_kernel,
                    gluon_nh._sparse_mla_split_nh_kernel, gluon_nh._sparse_mla_split_nh_fp8_kernel]
    names = [f.fn.__name__ for f in kernels]
    assert [rules.classify(n) for n in names] == ["attention"] * len(names), names
