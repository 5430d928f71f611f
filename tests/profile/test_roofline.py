"""Roofline ceilings against hand computation (numbers written out, not servelab's formulas)."""

from __future__ import annotations

import json

import pytest

from servelab.errors import UserError
from servelab.profile.ceiling_report import ceiling_report
from servelab.profile.presets import known_gpus, known_models, load_gpu, load_model
from servelab.profile.roofline import ceiling, expected_distinct_experts

H200_BW, H200_BF16 = 4.8e12, 989.4e12


def test_llama8b_bf16_batch1_on_h200_is_hbm_over_16gb():
    m, _ = load_model("llama-3.1-8b")
    g, _ = load_gpu("h200")
    (b,) = ceiling(m, g, [1], context=1)
    layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    params = 32 * layer + 128256 * 4096  # embeddings are not read, the LM head is
    assert b.weight_bytes == pytest.approx(2 * params, rel=1e-12)
    assert b.bound == "memory"
    assert b.tok_s == pytest.approx(H200_BW / (2 * params + 32 * 1 * 4096), rel=1e-9)
    assert b.tok_s == pytest.approx(4.8e12 / 16e9, rel=0.10)  # the sanity check


def test_expected_distinct_experts():
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8.0)
    assert expected_distinct_experts(256, 8, 2) == pytest.approx(256 * (1 - (248 / 256) ** 2))
    assert expected_distinct_experts(256, 8, 10_000) == pytest.approx(256.0)
    # Monte-Carlo reference: uniform top-k without replacement per token
    import random

    rng = random.Random(0)
    trials = [len({e for _ in range(16) for e in rng.sample(range(64), 4)}) for _ in range(4000)]
    assert sum(trials) / len(trials) == pytest.approx(expected_distinct_experts(64, 4, 16), rel=0.01)


def test_moe_qwen3_batch8_by_hand():
    m, _ = load_model("qwen3-30b-a3b")
    g, _ = load_gpu("h200")
    (b,) = ceiling(m, g, [8], context=1024)
    attn = 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 32 * 128 * 2048
    expert = 3 * 2048 * 768
    router = 2048 * 128
    lm = 151936 * 2048
    distinct = 128 * (1 - (1 - 8 / 128) ** 8)
    weights = 2 * (48 * (attn + router) + 48 * distinct * expert + lm)
    kv = 8 * 48 * 1024 * (2 * 4 * 128 * 2)
    flops = 2 * 8 * (48 * (attn + router + 8 * expert) + lm) + 8 * 48 * 2 * 32 * 1024 * 256
    assert b.distinct_experts == pytest.approx(distinct)
    assert b.weight_bytes == pytest.approx(weights, rel=1e-12)
    assert b.kv_bytes == pytest.approx(kv, rel=1e-12)
    assert b.flops == pytest.approx(flops, rel=1e-12)
    step = max((weights + kv) / H200_BW, flops / H200_BF16)
    assert b.tok_s == pytest.approx(8 / step, rel=1e-9)


def test_mtp_by_hand_and_verifier_saturation():
    m, _ = load_model("qwen3-30b-a3b")
    g, _ = load_gpu("h200")
    ctx, tau = 512, 1.8
    attn = 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 32 * 128 * 2048
    expert, router, lm = 3 * 2048 * 768, 2048 * 128, 151936 * 2048
    kvb = 2 * 4 * 128 * 2

    def pass_s(batch, tokens, layers):
        d = 128 * (1 - (1 - 8 / 128) ** tokens)
        w = 2 * (layers * (attn + router) + layers * d * expert + lm)
        kv = batch * layers * ctx * kvb
        fl = 2 * tokens * (layers * (attn + router + 8 * expert) + lm)
        fl += tokens * layers * 2 * 32 * ctx * 256
        return max((w + kv) / H200_BW, fl / H200_BF16)

    for batch in (1, 4):
        (b,) = ceiling(m, g, [batch], context=ctx, mtp_accept=tau, mtp_draft=1)
        hand = batch * tau / (pass_s(batch, 2 * batch, 48) + pass_s(batch, batch, 1))
        assert b.tok_s == pytest.approx(hand, rel=1e-9)
    # MoE at batch 1: the draft token routes to other experts, so verifying 2 tokens reads
    # ~2x the expert bytes; at batch 16 most experts are read anyway and MTP pays more
    gain = {}
    for batch in (1, 16):
        (plain,) = ceiling(m, g, [batch], context=ctx)
        (mtp,) = ceiling(m, g, [batch], context=ctx, mtp_accept=tau, mtp_draft=1)
        gain[batch] = mtp.tok_s / plain.tok_s
    assert gain[1] < gain[16]


def test_mtp_verifier_saturates_on_a_dense_model():
    """Dense 8B: the verify pass is memory-bound at small batch (MTP ~ tau / (1 + draft cost))
    and compute-bound at large batch, where MTP cannot help (story: +47% at C=1, ~0 at C=16)."""
    m, _ = load_model("llama-3.1-8b")
    g, _ = load_gpu("h200")
    gains = []
    for batch in (1, 128, 256, 512, 1024):
        (plain,) = ceiling(m, g, [batch], context=512)
        (mtp,) = ceiling(m, g, [batch], context=512, mtp_accept=1.8, mtp_draft=1)
        gains.append(mtp.tok_s / plain.tok_s)
        # the verify pass (2 tokens per request) turns compute-bound near 200-256 requests
        assert mtp.bound == ("memory" if batch <= 128 else "compute")
    assert min(gains[:2]) > 1.5  # memory-bound: ~ tau / (1 + draft cost)
    assert gains[1:] == sorted(gains[1:], reverse=True) and gains[-1] < 1.0


def test_tensor_parallel_allreduce_and_kv_sharding():
    m, _ = load_model("llama-3.1-70b")
    g, _ = load_gpu("h200")
    (b,) = ceiling(m, g, [16], context=2048, tp=8)
    allreduce = 2 * 80 * 2 * (7 / 8) * 16 * 8192 * 2  # two per layer, ring, bf16
    assert b.comm_us == pytest.approx(allreduce / 450e9 * 1e6, rel=1e-9)
    kv = 16 * 80 * 2048 * (2 * 8 * 128 * 2)
    assert b.memory_us == pytest.approx((b.weight_bytes / 8 + kv / 8) / H200_BW * 1e6, rel=1e-9)


def test_pcie_all_reduce_can_bind():
    """8 x RTX PRO 6000 (PCIe, no NVLink): at batch 512 the all-reduce term is the largest."""
    m, _ = load_model("llama-3.1-70b")
    g, _ = load_gpu("rtx-pro-6000")
    small, big = ceiling(m, g, [1, 512], context=1024, tp=8)
    assert small.bound == "memory"
    assert big.bound == "communication"
    assert big.comm_us == pytest.approx(2 * 80 * 2 * (7 / 8) * 512 * 8192 * 2 / 64e9 * 1e6)
    # a fixed 20 us per all-reduce (2 per layer) is added to the bandwidth term
    (lat,) = ceiling(m, g, [1], context=1024, tp=8, allreduce_latency_us=20.0)
    assert lat.comm_us == pytest.approx(small.comm_us + 2 * 80 * 20.0)
    assert lat.step_us == pytest.approx(small.step_us + 2 * 80 * 20.0)


def test_mla_kv_is_read_by_every_tp_rank_and_sparse_topk_caps_it():
    m, _ = load_model("deepseek-v3.2")
    g, _ = load_gpu("h200")
    (b,) = ceiling(m, g, [4], context=8192, tp=8, kv_dtype="fp8")
    kv = 4 * 61 * (2048 * 656 + 8192 * (128 + 4))  # top-2048 latent rows + indexer keys, all
    assert b.kv_bytes == pytest.approx(kv, rel=1e-12)
    assert b.memory_us == pytest.approx((b.weight_bytes / 8 + kv) / H200_BW * 1e6, rel=1e-9)


@pytest.mark.parametrize(
    "name,total_b,active_b",
    [("deepseek-v3", 671, 36.6), ("deepseek-v3.2", 671, 37.5), ("deepseek-v4-flash", 284, 13.3),
     ("qwen3-30b-a3b", 30.2, 3.0), ("llama-3.1-70b", 69.5, 69.5),
     ("llama-3.1-8b", (8_030_261_248 - 128256 * 4096) / 1e9, 7.50)],  # HF count - embeddings
)
def test_preset_parameter_counts(name, total_b, active_b):
    """Published totals (DeepSeek-V3 671B / 36.6B active incl. the LM head; V4-Flash 284B /
    13B; Qwen3-30B-A3B 30.5B / 3.3B incl. 0.3B embeddings) without the input embeddings."""
    m, _ = load_model(name)
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=0.02)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.03)


def test_all_presets_load_and_have_sources():
    for name in known_models():
        m, src = load_model(name)
        assert src["source"] and m.total_params > 0
    for name in known_gpus():
        g, src = load_gpu(name)
        assert src["source"] and g.hbm_bytes_s > 0 and "bf16" in g.flops
    assert {"h100", "h200", "b200", "rtx-pro-6000"} <= set(known_gpus())


@pytest.mark.parametrize(
    "name,hbm,mem,bf16,fp8",
    [  # datasheet numbers (dense tensor rates = the sparse figures / 2)
        ("h100", 3.35e12, 80e9, 1979e12 / 2, 3958e12 / 2),  # H100 SXM
        ("h200", 4.8e12, 141e9, 1979e12 / 2, 3958e12 / 2),  # H200 SXM: H100's tensor rates
        ("b200", 64e12 / 8, 1440e9 / 8, 36e15 / 8 / 2, 72e15 / 8 / 2),  # DGX B200, per GPU
        ("rtx-pro-6000", 1597e9, 96e9, 4000e12 / 8, 4000e12 / 4),  # Server Edition
        ("rtx-pro-6000-ws", 1792e9, 96e9, 4000e12 / 8, 4000e12 / 4),  # Workstation Edition
    ],
)
def test_gpu_presets_match_their_datasheets(name, hbm, mem, bf16, fp8):
    g, _ = load_gpu(name)
    assert g.hbm_bytes_s == pytest.approx(hbm, rel=1e-3)
    assert g.memory_bytes == pytest.approx(mem, rel=1e-3)
    assert g.flops["bf16"] == pytest.approx(bf16, rel=1e-3)
    assert g.flops["fp8"] == pytest.approx(fp8, rel=1e-3)


def test_unknown_presets_list_the_known_ones():
    with pytest.raises(UserError, match="known: deepseek-v3, .*llama-3.1-8b"):
        load_model("gpt-5")
    with pytest.raises(UserError, match="known: b200, h100, h200, rtx-pro-6000"):
        load_gpu("tpu")


def test_any_hf_config_json(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 128256}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    a, _ = load_model(str(p))
    b, _ = load_model("llama-3.1-8b")
    assert a.total_params == b.total_params and a.kv_bytes_per_token == b.kv_bytes_per_token
    v4 = {"model_type": "deepseek_v4", "hidden_size": 4096, "num_hidden_layers": 43,
          "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
          "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8,
          "vocab_size": 129280, "n_routed_experts": 256, "n_shared_experts": 1,
          "num_experts_per_tok": 6, "moe_intermediate_size": 2048, "index_n_heads": 64,
          "index_head_dim": 128, "index_topk": 512, "sliding_window": 128,
          "expert_dtype": "fp4", "quantization_config": {"quant_method": "fp8"}}
    p.write_text(json.dumps(v4))
    from_json, _ = load_model(str(p))
    preset, _ = load_model("deepseek-v4-flash")
    assert from_json.total_params == preset.total_params
    assert (from_json.default_weight_dtype, from_json.default_expert_dtype) == ("fp8", "fp4")
    p.write_text("[1, 2]")
    with pytest.raises(UserError, match="one JSON object"):
        load_model(str(p))
    p.write_text(json.dumps({"hidden_size": 10}))
    with pytest.raises(UserError, match="num_hidden_layers"):
        load_model(str(p))
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10}
    for extra, needle in [  # incomplete configs: one line naming the key, no KeyError traceback
        ({"model_type": "deepseek_v4"}, "no 'head_dim'"),
        ({"kv_lora_rank": 16, "qk_nope_head_dim": 8}, "no 'qk_rope_head_dim'"),
        ({"num_experts": 8, "num_experts_per_tok": 2}, "no 'moe_intermediate_size'"),
        ({"intermediate_size": "big"}, "not a number"),
        ({"num_attention_heads": 0, "intermediate_size": 8}, "must be >= 1"),
    ]:
        p.write_text(json.dumps(base | extra))
        with pytest.raises(UserError, match=needle):
            load_model(str(p))


def test_ceiling_report_measured_efficiency_and_fit_warning():
    doc = ceiling_report("llama-3.1-8b", "h200", [1], context=1, measured_tok_s=150.0)
    (row,) = doc["bounds"]
    assert doc["tok_s"]["1"] == row["tok_s"]
    assert row["efficiency"] == pytest.approx(150.0 / row["tok_s"])
    big = ceiling_report("deepseek-v3", "h200", [1], tp=1)
    assert any("more than" in w for w in big["warnings"])
    assert not ceiling_report("deepseek-v3", "h200", [1], tp=8)["warnings"]


def test_report_names_the_dtypes_the_bound_used():
    """An explicit --weight-dtype sets the experts too (the CLI help says so): the report's
    dtypes must be the ones the bytes were computed with, not the preset's defaults."""
    m, _ = load_model("deepseek-v4-flash")
    g, _ = load_gpu("b200")
    (fp4_experts,) = ceiling(m, g, [1], weight_dtype="fp8", expert_dtype="fp4")
    (fp8_experts,) = ceiling(m, g, [1], weight_dtype="fp8", expert_dtype="fp8")
    assert fp8_experts.weight_bytes > fp4_experts.weight_bytes
    default = ceiling_report("deepseek-v4-flash", "b200", [1])
    assert (default["weight_dtype"], default["expert_dtype"]) == ("fp8", "fp4")
    assert default["bounds"][0]["weight_bytes"] == fp4_experts.weight_bytes
    explicit = ceiling_report("deepseek-v4-flash", "b200", [1], weight_dtype="fp8")
    assert (explicit["weight_dtype"], explicit["expert_dtype"]) == ("fp8", "fp8")
    assert explicit["bounds"][0]["weight_bytes"] == fp8_experts.weight_bytes
    dense = ceiling_report("llama-3.1-8b", "h200", [1], weight_dtype="fp8")
    assert (dense["weight_dtype"], dense["expert_dtype"]) == ("fp8", None)


def test_bad_ceiling_inputs():
    m, _ = load_model("llama-3.1-8b")
    g, _ = load_gpu("h200")
    with pytest.raises(UserError, match="at least one batch"):
        ceiling(m, g, [])
    with pytest.raises(UserError, match="--context must be between 0"):
        ceiling(m, g, [1], context=-5)
    # numbers no deployment has are one-line errors, not overflows inside numpy
    for kwargs, flag in [({"tp": 10**20}, "--tp"), ({"context": 10**20}, "--context"),
                         ({"batches": [1, 10**20]}, "--batch"),
                         ({"mtp_accept": 1.5, "mtp_draft": 10**20}, "--mtp-draft"),
                         ({"allreduce_latency_us": float("inf")}, "--allreduce-latency-us")]:
        with pytest.raises(UserError, match=flag):
            ceiling(m, g, **{"batches": [1], **kwargs})
    with pytest.raises(UserError, match="--mtp-draft must be >= 1"):
        ceiling(m, g, [1], mtp_accept=1.0, mtp_draft=0)
    with pytest.raises(UserError, match="--measured must be a positive"):
        ceiling_report("llama-3.1-8b", "h200", [1], measured_tok_s=0.0)
    with pytest.raises(UserError, match="mtp-accept"):
        ceiling(m, g, [1], mtp_accept=3.0, mtp_draft=1)
    with pytest.raises(UserError, match="unknown dtype"):
        ceiling(m, g, [1], weight_dtype="int3")
    with pytest.raises(UserError, match="kv-dtype"):
        ceiling(m, g, [1], kv_dtype="int4")
