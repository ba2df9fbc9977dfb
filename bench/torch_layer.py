#!/usr/bin/env python3
"""PyTorch peer of `deepinfer bench gpu` (issue 10, item 3): one V4.1 backbone layer per role, written in
PyTorch to be FAST on an H200, not exact. Our CUDA layer is compared against these numbers.

    python3 bench/torch_layer.py CKPT_DIR [--json] [--small] [--layers 0,2] [--no-compile] [--no-graph]

CKPT_DIR is what `deepinfer mkmodel --preset full-layer` (or `small`) wrote. For every layer role in it
(SWA-only, kv+index source, candidate source, re-index, reuse; Engram where the config puts it) the script
times one block (Engram, mHC attention sub-layer, mHC MoE sub-layer):
  decode   batch 1, 8, 64, 256 × context 4K, 64K (synthetic caches of the real shapes), and
  prefill  8,192 tokens of one sequence.
--small is the quick check (batch 1 and 64, context 4K, a 2K prefill, fewer repetitions).

Where it trades exactness for speed (the reference numerics are in shared/spec/model.md §3-§5):
  * FP8 linears: torch._scaled_mm with ROW-WISE scales. The checkpoint's 32×32 E8M0 block scales are
    folded in at load (dequantise, then requantise every output row to e4m3 with one f32 scale);
    activations get one dynamic scale per token instead of one per 32 values. _scaled_mm on Hopper has
    no 32-wide block scaling; row-wise is its fastest scaled mode.
  * FP4 routed experts are dequantised to bf16 at load ([E, 2I, D] for w1‖w3, [E, D, I] for w2) and run
    as grouped GEMMs (tokens sorted by expert, torch._grouped_mm with group offsets); without
    _grouped_mm, a loop over the active experts.
  * Caches are plain bf16 (no FP8/FP4 QDQ). Attention is scaled_dot_product_attention over gathered KV
    (window ‖ selected compressed entries ‖ one zero key whose additive mask is the sink logit).
  * Engram row ids are random per token (hashing is a few integer ops; the cost is the row gather).
  * The deferred mHC pre-mix of the previous sub-layer is an input (random, like the residual streams).
  * Decode steps are captured in one CUDA graph per shape; small elementwise pieces (mHC mixes and
    Sinkhorn, norms, RoPE, activation quantisation) go through torch.compile.
  * The f32 GEMMs (mHC mixes, router, ratio-2 compressor) run in TF32.
Times are medians over --iters CUDA-event-timed repetitions (graph replays for decode).

Reported per shape: time; for decode the bytes that must be read (weights as stored in the checkpoint —
FP8 + scales, FP4 experts of the distinct experts the step routes to + scales, bf16/f32 as stored — and
caches in their compact formats of model.md §4.7: window 528 B/slot, compressed KV 288 B/entry, index
keys 68 B/entry, Engram rows 264 B), achieved bandwidth = those bytes ÷ time, and its ratio to the 4.47
TB/s HBM read roofline; for prefill the nominal FLOPs, TFLOP/s and the ratio to the 1,445 TFLOP/s FP8
peak (both ceilings measured on an H200, issue 10).
"""
import argparse
import gc
import json
import math
import os
import struct
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

HBM_READ_BPS = 4.47e12  # measured H200 HBM read bandwidth (issue 10)
FP8_PEAK_FLOPS = 1445e12  # measured torch._scaled_mm 8192² (issue 10)
HC_EPS = 1e-6
NORM_EPS = 1e-20
DEV = "cuda"

# ---------------------------------------------------------------------------------------------------
# checkpoint access


class Checkpoint:
    """Tensors of a safetensors checkpoint directory, read with the `safetensors` package (a raw header
    reader covers dtypes the installed package may not know, e.g. F8_E8M0 in old versions)."""

    def __init__(self, path):
        self.path = path
        with open(os.path.join(path, "config.json")) as f:
            self.config = json.load(f)
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            self.weight_map = json.load(f)["weight_map"]
        self._handles = {}
        self._headers = {}

    def has(self, name):
        return name in self.weight_map

    def _header(self, shard):
        if shard not in self._headers:
            with open(os.path.join(self.path, shard), "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                self._headers[shard] = (8 + n, json.loads(f.read(n)))
        return self._headers[shard]

    def nbytes(self, name):
        base, hdr = self._header(self.weight_map[name])
        a, b = hdr[name]["data_offsets"]
        return b - a

    def get(self, name):
        """CPU tensor; 1-byte float formats (F8_E4M3, F8_E8M0) and I8 come back as uint8."""
        shard = self.weight_map[name]
        base, hdr = self._header(shard)
        meta = hdr[name]
        try:
            from safetensors import safe_open

            if shard not in self._handles:
                self._handles[shard] = safe_open(os.path.join(self.path, shard), framework="pt")
            t = self._handles[shard].get_tensor(name)
        except Exception:
            a, b = meta["data_offsets"]
            raw = np.memmap(os.path.join(self.path, shard), dtype=np.uint8, mode="r", offset=base + a,
                            shape=(b - a,))
            dt = {"BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64}.get(meta["dtype"], torch.uint8)
            t = torch.frombuffer(bytearray(raw), dtype=dt).view(meta["shape"])
        if t.element_size() == 1 and t.dtype != torch.uint8:
            t = t.view(torch.uint8)
        return t


def e8m0(s_u8):
    return torch.exp2(s_u8.to(DEV).float() - 127.0)


def dequant_fp8(ck, name):
    """f32 [N, K] on the GPU from an FP8 weight with 32×32 E8M0 block scales."""
    w = ck.get(name + ".weight").to(DEV).view(torch.float8_e4m3fn).float()  # [N, K]
    s = e8m0(ck.get(name + ".scale"))  # [ceil(N/32), ceil(K/32)]
    n, k = w.shape
    if tuple(s.shape) != (-(-n // 32), -(-k // 32)):
        raise ValueError(f"{name}.scale: shape {tuple(s.shape)}, expected {(-(-n // 32), -(-k // 32))} "
                         f"for a [{n}, {k}] weight with 32x32 blocks")
    s = s.repeat_interleave(32, 0)[:n].repeat_interleave(32, 1)[:, :k]
    return w * s


FP4_LUT = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


def dequant_fp4(ck, name, out):
    """Dequantise an FP4 expert matrix (I8 [N, K/2], low nibble = even column) into bf16 `out` [N, K]."""
    b = ck.get(name + ".weight").to(DEV, non_blocking=True)  # [N, K/2] two e2m1 codes a byte
    s = e8m0(ck.get(name + ".scale"))  # [N, K/32]
    if tuple(b.shape) != (out.shape[0], out.shape[1] // 2) or tuple(s.shape) != (out.shape[0], out.shape[1] // 32):
        raise ValueError(f"{name}: weight {tuple(b.shape)} / scale {tuple(s.shape)}, expected "
                         f"{(out.shape[0], out.shape[1] // 2)} / {(out.shape[0], out.shape[1] // 32)}")
    lut = FP4_LUT.to(DEV)
    v = torch.stack((lut[(b & 0xF).long()], lut[(b >> 4).long()]), dim=-1).flatten(1)  # [N, K]
    out.copy_((v.view(v.shape[0], -1, 32) * s[:, :, None]).flatten(1))


# ---------------------------------------------------------------------------------------------------
# building blocks


def quant_rows(x):
    """Per-token dynamic e4m3 quantisation: q [M, K] fp8, scale [M, 1] f32."""
    xf = x.float()
    s = xf.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0
    return (xf / s).to(torch.float8_e4m3fn), s


class Fp8Linear:
    """y = x·Wᵀ through torch._scaled_mm with row-wise scales (block scales folded at load, see top)."""

    pad16 = False  # set by probe() when _scaled_mm wants M % 16 == 0

    def __init__(self, w_f32):
        amax = w_f32.abs().amax(1, keepdim=True).clamp(min=1e-12)
        self.sw = (amax / 448.0).view(1, -1).contiguous()  # [1, N] f32
        self.w = (w_f32 / self.sw.view(-1, 1)).to(torch.float8_e4m3fn).contiguous()  # [N, K]
        self.n, self.k = self.w.shape

    @classmethod
    def load(cls, ck, name):
        return cls(dequant_fp8(ck, name))

    def __call__(self, x):
        lead = x.shape[:-1]
        x = x.reshape(-1, self.k)
        m = x.shape[0]
        q, s = quant_rows_c(x)
        if Fp8Linear.pad16 and m % 16:
            q = F.pad(q.view(torch.uint8), (0, 0, 0, 16 - m % 16)).view(torch.float8_e4m3fn)
            s = F.pad(s, (0, 0, 0, 16 - m % 16), value=1.0)
        y = torch._scaled_mm(q, self.w.t(), scale_a=s, scale_b=self.sw, out_dtype=torch.bfloat16,
                             use_fast_accum=True)
        return y[:m].view(*lead, self.n)

    @staticmethod
    def probe():
        w = Fp8Linear(torch.randn(64, 64, device=DEV))
        try:
            w(torch.randn(1, 64, device=DEV, dtype=torch.bfloat16))
        except RuntimeError:
            Fp8Linear.pad16 = True
            w(torch.randn(1, 64, device=DEV, dtype=torch.bfloat16))


def rmsnorm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS) * w).to(torch.bfloat16)


def rope(x, cos, sin):
    """Interleaved-pair RoPE on the last 2·len(cos) channels; cos/sin broadcast over x's middle dims."""
    r = cos.shape[-1] * 2
    head, tail = x[..., :-r], x[..., -r:].float().unflatten(-1, (-1, 2))
    a, b = tail[..., 0], tail[..., 1]
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)
    return torch.cat((head, rot.to(x.dtype)), -1)


def hc_mixes(X, fn, base, scale, iters):
    """mHC mixes of one sub-layer (model.md §3.3 steps 1-4): pre [B,4], post [B,4], C [B,4,4]."""
    xf = X.float().flatten(1)
    m = (xf @ fn.t()) * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)
    pre = torch.sigmoid(m[:, :4] * scale[0] + base[:4]) + HC_EPS
    post = 2 * torch.sigmoid(m[:, 4:8] * scale[1] + base[4:8])
    c = (m[:, 8:] * scale[2] + base[8:]).view(-1, 4, 4)
    c = torch.softmax(c, -1) + HC_EPS
    c = c / (c.sum(1, keepdim=True) + HC_EPS)
    for _ in range(iters - 1):
        c = c / (c.sum(2, keepdim=True) + HC_EPS)
        c = c / (c.sum(1, keepdim=True) + HC_EPS)
    return pre, post, c


def collapse_norm(X, pre, w):
    return rmsnorm((pre[:, :, None] * X.float()).sum(1), w)


def hc_expand(X, z, post, c):
    return (post[:, :, None] * z.float()[:, None, :] + torch.einsum("bjk,bjd->bkd", c, X.float())).to(torch.bfloat16)


def swiglu(h, w=None):
    g, u = h.float().chunk(2, -1)
    a = F.silu(g.clamp(max=10.0)) * u.clamp(-10.0, 10.0)
    if w is not None:
        a = a * w[:, None]
    return a.to(torch.bfloat16)


# torch.compile'd versions; replaced by the eager ones with --no-compile or when compiling fails.
quant_rows_c, hc_mixes_c, collapse_norm_c, hc_expand_c, rope_c, swiglu_c = (quant_rows, hc_mixes, collapse_norm,
                                                                          hc_expand, rope, swiglu)


def setup_compile(on):
    global quant_rows_c, hc_mixes_c, collapse_norm_c, hc_expand_c, rope_c, swiglu_c
    if not on:
        return "off"
    try:
        c = lambda f: torch.compile(f, dynamic=None)  # noqa: E731
        quant_rows_c, collapse_norm_c, hc_expand_c, rope_c, swiglu_c = (c(quant_rows), c(collapse_norm),
                                                                       c(hc_expand), c(rope), c(swiglu))
        hc_mixes_c = torch.compile(hc_mixes, dynamic=None)
        x = torch.randn(2, 64, device=DEV, dtype=torch.bfloat16)
        quant_rows_c(x)
        return "on"
    except Exception as e:  # noqa: BLE001
        quant_rows_c, hc_mixes_c, collapse_norm_c, hc_expand_c, rope_c, swiglu_c = (
            quant_rows, hc_mixes, collapse_norm, hc_expand, rope, swiglu)
        return f"failed ({type(e).__name__}: {str(e)[:120]}), eager"


def rope_freqs(cfg, ratio):
    """ω_i per model.md §3.1: base rope_theta without YaRN on ratio-0 layers, compress_rope_theta + YaRN."""
    dim = cfg["qk_rope_head_dim"]
    base = cfg["rope_theta"] if ratio == 0 else cfg["compress_rope_theta"]
    w = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if ratio > 0:
        ys = cfg["rope_scaling"]
        orig, fac = ys["original_max_position_embeddings"], ys["factor"]
        c = lambda n: dim * math.log(orig / (n * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
        lo, hi = max(math.floor(c(ys["beta_fast"])), 0), min(math.ceil(c(ys["beta_slow"])), dim - 1)
        hi = hi + 0.001 if hi == lo else hi
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        w = w / fac * ramp + w * (1 - ramp)
    return w.float().to(DEV)


def cos_sin(freqs, pos):
    ang = pos.float()[:, None] * freqs[None, :]
    return torch.cos(ang), torch.sin(ang)


def attend(q, kv, bias, scale, impl):
    """q [N, H, d], kv [N, S, d] (keys = values), bias [N, H, S] additive → [N, H, d] bf16."""
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q[:, None], kv[:, None], kv[:, None], attn_mask=bias[:, None],
                                              scale=scale)[:, 0]
    s = torch.bmm(q, kv.transpose(1, 2)).float() * scale + bias
    return torch.bmm(torch.softmax(s, -1).to(kv.dtype), kv)


# ---------------------------------------------------------------------------------------------------
# one layer


class Layer:
    def __init__(self, ck, L, tc):
        self.L, self.tc = L, tc
        p = f"layers.{L}."
        self.ratio = tc["compress_ratios"][L]
        self.kv_src = L in tc.get("kv_source_layer_ids", [])
        self.idx_src = L in tc.get("index_source_layer_ids", [])
        self.cand = L == tc.get("candidate_source_layer_id", -1)
        self.reindex = self.idx_src and not self.kv_src and self.ratio > 0
        self.engram = L in tc.get("engram_layer_ids", [])
        self.role = role_name(tc, L)
        D, H, hd = tc["hidden_size"], tc["num_attention_heads"], tc["head_dim"]
        self.D, self.H, self.hd = D, H, hd
        self.G, self.olora = tc["o_groups"], tc["o_lora_rank"]
        self.E, self.k, self.I = tc["n_routed_experts"], tc["num_experts_per_tok"], tc["moe_intermediate_size"]
        self.win, self.topk = tc["sliding_window"], tc["index_topk"]
        self.ih, self.idim = tc["index_n_heads"], tc["index_head_dim"]
        self.sinkhorn = tc["hc_sinkhorn_iters"]
        g = lambda n: ck.get(p + n).to(DEV)  # noqa: E731
        f32 = lambda n: g(n).float()  # noqa: E731
        # ---- weights as stored (bytes a decode step must read, experts and Engram rows aside) ----
        self.static_bytes = sum(ck.nbytes(n) for n in ck.weight_map
                                if n.startswith(p) and ".experts." not in n and ".engram.embed." not in n)
        # f32 fn [24, 4D], base [24], scale [3] for each sub-layer
        self.hc = {s: (f32(f"hc_{s}_fn"), f32(f"hc_{s}_base"), f32(f"hc_{s}_scale")) for s in ("attn", "ffn")}
        self.attn_norm, self.ffn_norm = f32("attn_norm.weight"), f32("ffn_norm.weight")  # f32 [D]
        self.wq_a = Fp8Linear.load(ck, p + "attn.wq_a")  # [q_lora, D]
        self.wq_b = Fp8Linear.load(ck, p + "attn.wq_b")  # [H·hd, q_lora]
        self.q_norm = f32("attn.q_norm.weight")  # f32 [q_lora]
        self.wkv, self.kv_norm = Fp8Linear.load(ck, p + "attn.wkv"), f32("attn.kv_norm.weight")  # [hd, D], f32 [hd]
        # wo_a is multiplied in bf16 by the reference too (§2.2): [G, o_lora, H/G·hd]
        self.wo_a = dequant_fp8(ck, p + "attn.wo_a").to(torch.bfloat16).view(self.G, self.olora, -1)
        self.wo_b = Fp8Linear.load(ck, p + "attn.wo_b")
        self.sink = f32("attn.attn_sink")  # f32 [H]
        self.freqs = rope_freqs(tc, self.ratio)  # f32 [rope/2]
        if self.kv_src:
            self.c_wkv = g("attn.compressor.wkv.weight")  # bf16 [hd, D]
            if self.ratio == 2:  # the reference runs the ratio-2 compressor in f32 (§4.4)
                self.c_wkv_f = self.c_wkv.float()
                self.c_wgate_f = g("attn.compressor.wgate.weight").float()
            self.c_norm = f32("attn.compressor.norm.weight")  # f32 [hd]
            # bf16 [idim, hd], f32 [idim]
            self.i_wk, self.i_knorm = g("attn.indexer.wk.weight"), f32("attn.indexer.k_norm.weight")
        if self.idx_src:
            self.i_wq_b = Fp8Linear.load(ck, p + "attn.indexer.wq_b")  # [ih·idim, q_lora]
            self.i_wproj = g("attn.indexer.weights_proj.weight")  # bf16 [ih, D]
        # ---- MoE ----
        self.gate_w, self.gate_b = f32("ffn.gate.weight"), f32("ffn.gate.bias")  # f32 [E, D], [E]
        self.sh13 = Fp8Linear(  # [2I, D]: w1 ‖ w3 in one GEMM
            torch.cat((dequant_fp8(ck, p + "ffn.shared_experts.w1"), dequant_fp8(ck, p + "ffn.shared_experts.w3"))))
        self.sh2 = Fp8Linear.load(ck, p + "ffn.shared_experts.w2")  # [D, I]
        E, I = self.E, self.I
        self.w13 = torch.empty(E, 2 * I, D, device=DEV, dtype=torch.bfloat16)  # [E, 2I, D] bf16
        self.w2 = torch.empty(E, D, I, device=DEV, dtype=torch.bfloat16)  # [E, D, I] bf16
        for e in range(E):
            q = f"{p}ffn.experts.{e}."
            dequant_fp4(ck, q + "w1", self.w13[e, :I])
            dequant_fp4(ck, q + "w3", self.w13[e, I:])
            dequant_fp4(ck, q + "w2", self.w2[e])
        self.expert_bytes = sum(ck.nbytes(f"{p}ffn.experts.0.{w}.{s}") for w in ("w1", "w2", "w3")
                                for s in ("weight", "scale"))
        # ---- Engram ----
        if self.engram:
            self.e_tab = g("engram.embed.weight")  # [rows, hd] e4m3 bytes
            self.e_scale = g("engram.embed.scale")  # [rows, hd/32] E8M0 bytes
            self.e_wkv = Fp8Linear.load(ck, p + "engram.wkv")  # [5D, rows·hd_e]: 4 keys ‖ value
            self.e_wq = f32("engram.q_weight") * f32("engram.k_weight")  # [4, D]
            self.e_rows = (tc["engram_max_ngram_size"] - 1) * tc["engram_n_heads"]
            self.e_row_bytes = self.e_tab.shape[1] + self.e_scale.shape[1]
        torch.cuda.synchronize()

    # ---- pieces shared by decode and prefill ----
    def engram_apply(self, X, ids):
        rows = self.e_tab[ids].view(torch.float8_e4m3fn).float()  # [N, r, hd]
        sc = torch.exp2(self.e_scale[ids].float() - 127.0).repeat_interleave(32, -1)
        e = (rows * sc).to(torch.bfloat16).flatten(1)  # [N, r·hd]
        kv = self.e_wkv(e).float()  # [N, 5D]
        k, v = kv[:, :4 * self.D].view(-1, 4, self.D), kv[:, 4 * self.D:]
        Xf = X.float()
        dot = (Xf * self.e_wq * k).sum(-1) * torch.rsqrt(Xf.pow(2).mean(-1) + NORM_EPS) \
            * torch.rsqrt(k.pow(2).mean(-1) + NORM_EPS) * self.D ** -0.5
        gate = torch.sigmoid(torch.sign(dot) * torch.sqrt(dot.abs().clamp(min=1e-6)))
        return (Xf + gate[..., None] * v[:, None, :]).to(torch.bfloat16)

    def q_path(self, x, cs):
        qr = rmsnorm(self.wq_a(x), self.q_norm)
        q = self.wq_b(qr).view(-1, self.H, self.hd)
        return rope_c(q, cs[0][:, None], cs[1][:, None]), qr

    def kv_path(self, x, cs):
        return rope_c(rmsnorm(self.wkv(x), self.kv_norm), *cs)

    def compress(self, x):
        """Compressed latents (before RoPE) of the chunk x [T, D] (ratio 1: T, ratio 2: T/2 entries)."""
        if self.ratio == 1:
            return rmsnorm(x @ self.c_wkv.t(), self.c_norm)
        xf = x.float()
        a = (xf @ self.c_wkv_f.t()).view(-1, 2, self.hd)
        gt = (xf @ self.c_wgate_f.t()).view(-1, 2, self.hd)
        return rmsnorm((torch.softmax(gt, 1) * a).sum(1), self.c_norm)

    def index_keys(self, kappa, cs):
        return rope_c(rmsnorm(kappa @ self.i_wk.t(), self.i_knorm), *cs)

    def index_query(self, x, qr, cs):
        qi = rope_c(self.i_wq_b(qr).view(-1, self.ih, self.idim), cs[0][:, None], cs[1][:, None])
        w = (x @ self.i_wproj.t()) * (self.idim ** -0.5 * self.ih ** -0.5)
        return qi, w

    def attn_out(self, o, cs):
        o = rope_c(o, cs[0][:, None], -cs[1][:, None])  # inverse RoPE with the query position
        n = o.shape[0]
        t = torch.bmm(o.reshape(n, self.G, -1).transpose(0, 1), self.wo_a.transpose(1, 2))  # [G, N, o_lora]
        return self.wo_b(t.transpose(0, 1).reshape(n, -1))

    def moe(self, x, grouped):
        n = x.shape[0]
        sc = torch.sqrt(F.softplus(x.float() @ self.gate_w.t()))
        idx = torch.topk(sc + self.gate_b, self.k, -1).indices  # [N, k]
        w = sc.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * 1.5
        flat = idx.flatten()
        order = torch.argsort(flat, stable=True)
        tok = order // self.k
        xs = x[tok]
        y = torch.zeros(n, self.D, device=DEV, dtype=torch.float32)
        if grouped:
            counts = torch.zeros(self.E, device=DEV, dtype=torch.int32).scatter_add_(
                0, flat, torch.ones_like(flat, dtype=torch.int32))
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            h = torch._grouped_mm(xs, self.w13.transpose(1, 2), offs=offs)
            a = swiglu_c(h, w.flatten()[order])
            ye = torch._grouped_mm(a, self.w2.transpose(1, 2), offs=offs)
        else:  # host-synchronising loop over the active experts
            se = flat[order]
            ye = torch.empty(n * self.k, self.D, device=DEV, dtype=torch.bfloat16)
            bounds = torch.searchsorted(se, torch.arange(self.E + 1, device=DEV)).tolist()
            wf = w.flatten()[order]
            for e in range(self.E):
                a0, a1 = bounds[e], bounds[e + 1]
                if a0 < a1:
                    a = swiglu_c(xs[a0:a1] @ self.w13[e].t(), wf[a0:a1])
                    ye[a0:a1] = a @ self.w2[e].t()
        y.index_add_(0, tok, ye.float())
        y += self.sh2(swiglu_c(self.sh13(x))).float()
        return y.to(torch.bfloat16), idx

    # ---- decode: one token for each of B sequences, every sequence at position ctx - 1 ----
    def make_decode_state(self, B, ctx, gen):
        R = self.ratio
        st = {"B": B, "ctx": ctx}
        rn = lambda *s: torch.randn(*s, device=DEV, dtype=torch.bfloat16, generator=gen)  # noqa: E731
        st["X"] = rn(B, 4, self.D)  # bf16 [B, 4, D] residual streams
        st["pre"] = torch.rand(B, 4, device=DEV, generator=gen) + 0.1  # f32 [B, 4] previous FFN pre-mix
        st["pos"] = torch.full((B,), ctx - 1, device=DEV, dtype=torch.int64)  # i64 [B]
        st["window"] = rn(B, self.win, self.hd)  # bf16 [B, 128, hd] ring
        if self.engram:
            # i64 [B, 24] Engram row ids (random: see the file comment)
            st["eids"] = torch.randint(0, self.e_tab.shape[0], (B, self.e_rows), device=DEV, generator=gen)
        if R > 0:
            nc = ctx // R
            st["nc"] = nc
            st["comp"] = rn(B, nc, self.hd)  # bf16 [B, ctx/R, hd] compressed KV
            if self.kv_src:
                st["cstate"] = torch.randn(B, self.hd, device=DEV, generator=gen)  # ratio-2 pending slot
                st["cgate"] = torch.randn(B, self.hd, device=DEV, generator=gen)  # f32 [B, hd] its gate score
            if self.idx_src:
                st["ikeys"] = rn(B, nc, self.idim)  # bf16 [B, ctx/R, idim] index keys
                if self.reindex:  # candidate entries handed down by the candidate source (synthetic)
                    nb, bs = self.tc.get("candidate_topk_blocks", 2048), self.tc.get("candidate_block_size", 8)
                    nb = min(nb, nc // bs)
                    blocks = torch.stack([torch.randperm(nc // bs, device=DEV, generator=gen)[:nb] for _ in range(B)])
                    # i64 [B, blocks·8] entry ids
                    st["cand"] = (blocks[:, :, None] * bs + torch.arange(bs, device=DEV)).flatten(1)
            else:  # reuse layer: top-k handed down by the latest index source (synthetic)
                st["sel"] = torch.randint(0, nc, (B, min(self.topk, nc)), device=DEV, generator=gen)  # i64 [B, 512]
        return st

    def decode_step(self, st, grouped, attn_impl):
        B = st["B"]
        X, pos = st["X"], st["pos"]
        cs = cos_sin(self.freqs, pos)
        bidx = torch.arange(B, device=DEV)
        if self.engram:
            X = self.engram_apply(X, st["eids"])
        pre_a, post_a, c_a = hc_mixes_c(X, *self.hc["attn"], self.sinkhorn)
        x = collapse_norm_c(X, st["pre"], self.attn_norm)
        q, qr = self.q_path(x, cs)
        st["window"][bidx, pos % self.win] = self.kv_path(x, cs)
        keys = [st["window"]]
        if self.ratio > 0:
            nc = st["nc"]
            if self.kv_src:  # this step completes entry nc − 1 (the worst case: every step emits)
                if self.ratio == 2:
                    xf = x.float()
                    a = torch.stack((st["cstate"], xf @ self.c_wkv_f.t()), 1)
                    gt = torch.stack((st["cgate"], xf @ self.c_wgate_f.t()), 1)
                    kappa = rmsnorm((torch.softmax(gt, 1) * a).sum(1), self.c_norm)
                else:
                    kappa = self.compress(x)
                cpos = cos_sin(self.freqs, (nc - 1) * self.ratio + torch.zeros_like(pos))
                st["ikeys"][:, nc - 1] = self.index_keys(kappa, cpos)
                st["comp"][:, nc - 1] = rope_c(kappa, *cpos)
            if self.idx_src:
                qi, w = self.index_query(x, qr, cs)
                ik = st["ikeys"]
                if self.reindex:
                    ik = torch.gather(ik, 1, st["cand"][:, :, None].expand(-1, -1, self.idim))
                s = torch.bmm(torch.relu(torch.bmm(ik, qi.transpose(1, 2))), w[:, :, None])[:, :, 0]  # [B, N]
                sel = torch.topk(s, min(self.topk, s.shape[1]), -1, sorted=False).indices
                if self.reindex:
                    sel = torch.gather(st["cand"], 1, sel)
                if self.cand:  # candidate mask for the later re-index layers: top blocks of 8 by max score
                    bs = self.tc.get("candidate_block_size", 8)
                    blk = s.view(B, -1, bs).amax(-1)
                    st["cand_out"] = torch.topk(blk, min(self.tc.get("candidate_topk_blocks", 2048),
                                                         blk.shape[1]), -1, sorted=False).indices
            else:
                sel = st["sel"]
            keys.append(torch.gather(st["comp"], 1, sel[:, :, None].expand(-1, -1, self.hd)))
        keys.append(torch.zeros(B, 1, self.hd, device=DEV, dtype=torch.bfloat16))  # sink key
        kv = torch.cat(keys, 1)
        bias = torch.zeros(B, self.H, kv.shape[1], device=DEV, dtype=torch.bfloat16)
        bias[:, :, -1] = self.sink.to(torch.bfloat16)
        o = attend(q, kv, bias, self.hd ** -0.5, attn_impl)
        X = hc_expand_c(X, self.attn_out(o, cs), post_a, c_a)
        pre_f, post_f, c_f = hc_mixes_c(X, *self.hc["ffn"], self.sinkhorn)
        y, idx = self.moe(collapse_norm_c(X, pre_a, self.ffn_norm), grouped)
        st["out"] = hc_expand_c(X, y, post_f, c_f)
        st["pre_out"], st["route"] = pre_f, idx

    def decode_bytes(self, st, distinct_experts):
        """Bytes one decode step must read (formats of model.md §4.7; see the file comment)."""
        B, R = st["B"], self.ratio
        b = self.static_bytes + distinct_experts * self.expert_bytes + B * self.win * 528
        if self.engram:
            b += B * self.e_rows * self.e_row_bytes
        if R > 0:
            b += B * min(self.topk, st["nc"]) * 288
            if self.idx_src:
                b += B * (st["cand"].shape[1] if self.reindex else st["nc"]) * 68
        return b

    # ---- prefill: T tokens of one sequence from position 0 ----
    def prefill(self, T, gen, grouped, attn_impl, chunk=1024):
        R, bf = self.ratio, torch.bfloat16
        X = torch.randn(T, 4, self.D, device=DEV, dtype=bf, generator=gen)
        pre = torch.rand(T, 4, device=DEV, generator=gen) + 0.1
        pos = torch.arange(T, device=DEV)
        cs = cos_sin(self.freqs, pos)
        if self.engram:
            ids = torch.randint(0, self.e_tab.shape[0], (T, self.e_rows), device=DEV, generator=gen)
            X = self.engram_apply(X, ids)
        pre_a, post_a, c_a = hc_mixes_c(X, *self.hc["attn"], self.sinkhorn)
        x = collapse_norm_c(X, pre, self.attn_norm)
        q, qr = self.q_path(x, cs)
        kvw = self.kv_path(x, cs)  # [T, hd]: the window keys
        if R > 0:
            nc = T // R
            if self.kv_src:
                kappa = self.compress(x)
                ccs = cos_sin(self.freqs, torch.arange(nc, device=DEV) * R)
                ikeys, comp = self.index_keys(kappa, ccs), rope_c(kappa, *ccs)
            else:  # the source layer's caches (synthetic)
                comp = torch.randn(nc, self.hd, device=DEV, dtype=bf, generator=gen)
                ikeys = torch.randn(nc, self.idim, device=DEV, dtype=bf, generator=gen)
            if self.idx_src:
                qi, w = self.index_query(x, qr, cs)
        outs = []
        ar_w = torch.arange(self.win, device=DEV)
        for c0 in range(0, T, chunk):
            p = pos[c0:c0 + chunk]
            n = p.shape[0]
            wpos = p[:, None] - (self.win - 1) + ar_w  # [n, win]: positions p−127 … p
            keys = [kvw[wpos.clamp(min=0)]]
            masks = [wpos < 0]
            if R > 0:
                vis = (p + 1) // R  # entries visible to each query
                k = min(self.topk, nc)
                if self.idx_src:
                    s = torch.einsum("nhd,cd->nhc", qi[c0:c0 + n], ikeys).relu_()
                    s = torch.einsum("nhc,nh->nc", s, w[c0:c0 + n].to(bf)).float()
                    s.masked_fill_(torch.arange(nc, device=DEV)[None] >= vis[:, None], float("-inf"))
                    if self.cand:
                        bs = self.tc.get("candidate_block_size", 8)
                        blk = s.view(n, -1, bs).amax(-1)
                        torch.topk(blk, min(self.tc.get("candidate_topk_blocks", 2048), blk.shape[1]), -1)
                    sel = torch.topk(s, k, -1, sorted=False).indices
                else:
                    sel = (torch.rand(n, k, device=DEV, generator=gen) * vis.clamp(min=1)[:, None]).long()
                keys.append(comp[sel])
                masks.append(sel >= vis[:, None])
            keys.append(torch.zeros(n, 1, self.hd, device=DEV, dtype=bf))
            masks.append(torch.zeros(n, 1, device=DEV, dtype=torch.bool))
            bias = torch.zeros(n, self.H, sum(m.shape[1] for m in masks), device=DEV, dtype=bf)
            bias.masked_fill_(torch.cat(masks, 1)[:, None, :], float("-inf"))
            bias[:, :, -1] = self.sink.to(bf)
            outs.append(attend(q[c0:c0 + n], torch.cat(keys, 1), bias, self.hd ** -0.5, attn_impl))
        X = hc_expand_c(X, self.attn_out(torch.cat(outs), cs), post_a, c_a)
        pre_f, post_f, c_f = hc_mixes_c(X, *self.hc["ffn"], self.sinkhorn)
        y, _ = self.moe(collapse_norm_c(X, pre_a, self.ffn_norm), grouped)
        return hc_expand_c(X, y, post_f, c_f), pre_f

    def prefill_flops(self, T):
        """Nominal FLOPs of the prefill (multiply-add = 2): GEMMs, attention, indexer scores."""
        tc, D, H, hd, R = self.tc, self.D, self.H, self.hd, self.ratio
        lin = [self.wq_a, self.wq_b, self.wkv, self.wo_b, self.sh13, self.sh2]
        if self.idx_src:
            lin.append(self.i_wq_b)
        mk = sum(l.n * l.k for l in lin) + self.wo_a.numel() + self.E * D + 2 * 24 * 4 * D
        mk += self.k * 3 * self.I * D
        if self.engram:
            mk += self.e_wkv.n * self.e_wkv.k
        if self.kv_src:
            mk += self.c_wkv.numel() * (2 if self.ratio == 2 else 1) + self.i_wk.numel() // max(R, 1)
        if self.idx_src:
            mk += self.i_wproj.numel()
        f = 2.0 * T * mk
        for p in range(T):
            keys = min(p + 1, self.win)
            if R > 0:
                vis = (p + 1) // R
                keys += min(self.topk, vis)
                if self.idx_src:
                    f += 2.0 * self.ih * self.idim * vis
            f += 2.0 * 2 * H * hd * keys
        return f


def role_name(tc, L):
    r = tc["compress_ratios"][L]
    kv, ix = L in tc.get("kv_source_layer_ids", []), L in tc.get("index_source_layer_ids", [])
    if r == 0:
        name = "swa"
    elif kv and L == tc.get("candidate_source_layer_id", -1):
        name = f"r{r}-kv-index-candidate-source"
    elif kv:
        name = f"r{r}-kv-index-source"
    elif ix:
        name = f"r{r}-reindex"
    else:
        name = f"r{r}-reuse"
    return name + ("+engram" if L in tc.get("engram_layer_ids", []) else "")


# ---------------------------------------------------------------------------------------------------
# timing


def time_fn(fn, iters, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) for a, b in ev)
    return ts[len(ts) // 2], ts[0]


def bench_decode(layer, B, ctx, args, impl):
    gen = torch.Generator(device=DEV).manual_seed(1000 * layer.L + B + ctx)
    st = layer.make_decode_state(B, ctx, gen)
    step = lambda: layer.decode_step(st, impl["grouped"], impl["attn"])  # noqa: E731
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = "off"
    run = step
    if args.graph and impl["grouped"]:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            run, graph = g.replay, "on"
        except Exception as e:  # noqa: BLE001
            graph = f"failed ({type(e).__name__}: {str(e)[:100]})"
            torch.cuda.synchronize()
    med, best = time_fn(run, args.iters)
    distinct = int(torch.unique(st["route"]).numel())
    must = layer.decode_bytes(st, distinct)
    del st
    return {"mode": "decode", "batch": B, "ctx": ctx, "time_ms": med, "best_ms": best, "cuda_graph": graph,
            "distinct_experts": distinct, "must_read_bytes": must, "achieved_TBps": must / (med * 1e-3) / 1e12,
            "hbm_roofline_ratio": must / (med * 1e-3) / HBM_READ_BPS}


def bench_prefill(layer, T, args, impl):
    gen = torch.Generator(device=DEV).manual_seed(7 + layer.L)
    fn = lambda: layer.prefill(T, gen, impl["grouped"], impl["attn"])  # noqa: E731
    med, best = time_fn(fn, max(2, args.iters // 4), warm=2)
    fl = layer.prefill_flops(T)
    return {"mode": "prefill", "tokens": T, "time_ms": med, "best_ms": best, "flops": fl,
            "tflops": fl / (med * 1e-3) / 1e12, "fp8_peak_ratio": fl / (med * 1e-3) / FP8_PEAK_FLOPS}


def probe_impl(args):
    """Which fast paths this PyTorch build takes, checked on small data before the real runs."""
    impl = {}
    Fp8Linear.probe()
    impl["scaled_mm_pad16"] = Fp8Linear.pad16
    impl["compile"] = setup_compile(args.compile)
    try:  # grouped GEMM against a plain loop
        a = torch.randn(48, 64, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(4, 32, 64, device=DEV, dtype=torch.bfloat16)  # [G, N, K]
        offs = torch.tensor([10, 10, 30, 48], device=DEV, dtype=torch.int32)
        y = torch._grouped_mm(a, b.transpose(1, 2), offs=offs)
        ref = torch.cat([a[:10] @ b[0].t(), a[10:30] @ b[2].t(), a[30:] @ b[3].t()])
        impl["grouped"] = bool(torch.allclose(y.float(), ref.float(), rtol=2e-2, atol=2e-1))
    except Exception as e:  # noqa: BLE001
        impl["grouped"] = False
        impl["grouped_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    impl["attn"] = "bmm"
    if args.attn == "sdpa":
        try:
            q = torch.randn(2, 8, 512, device=DEV, dtype=torch.bfloat16)
            kv = torch.randn(2, 100, 512, device=DEV, dtype=torch.bfloat16)
            bias = torch.zeros(2, 8, 100, device=DEV, dtype=torch.bfloat16)
            bias[:, :, 50:] = float("-inf")
            y = attend(q, kv, bias, 512 ** -0.5, "sdpa")
            ref = attend(q, kv, bias, 512 ** -0.5, "bmm")
            impl["attn"] = "sdpa" if torch.allclose(y.float(), ref.float(), atol=3e-2) else "bmm"
        except Exception as e:  # noqa: BLE001
            impl["attn_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    return impl


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--small", action="store_true", help="quick check: batch 1/64, ctx 4K, 2K prefill")
    ap.add_argument("--layers", default="", help="comma-separated layer ids (default: first layer of each role)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--prefill", type=int, default=8192)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--no-graph", dest="graph", action="store_false")
    ap.add_argument("--attn", choices=("sdpa", "bmm"), default="sdpa")
    ap.add_argument("--partial", default="", help="rewrite the JSON document to this file after every layer")
    args = ap.parse_args()
    batches, ctxs = (1, 8, 64, 256), (4096, 65536)
    if args.small:
        batches, ctxs, args.prefill, args.iters = (1, 64), (4096,), min(args.prefill, 2048), min(args.iters, 8)
    log = lambda *a: print(*a, file=sys.stderr if args.json else sys.stdout, flush=True)  # noqa: E731
    torch.backends.cuda.matmul.allow_tf32 = True  # the f32 GEMMs (mHC mixes, router, ratio-2 compressor)
    warnings.filterwarnings("ignore", module="torch._inductor")
    if not os.path.isfile(os.path.join(args.ckpt, "config.json")):
        print(f"torch_layer: {args.ckpt}/config.json not found (expected a `deepinfer mkmodel` output directory)",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_layer: no CUDA device visible to PyTorch (this benchmark runs on the GPU machine)",
              file=sys.stderr)
        return 2
    ck = Checkpoint(args.ckpt)
    tc = ck.config.get("text_config", ck.config)
    nl = tc["num_hidden_layers"]
    if args.layers:
        layers = [int(v) for v in args.layers.split(",")]
    else:
        seen, layers = set(), []
        for L in range(nl):
            if role_name(tc, L) not in seen:
                seen.add(role_name(tc, L))
                layers.append(L)
    impl = probe_impl(args)
    doc = {"bench": "torch_layer", "label": "PyTorch peer (fast, not exact)",
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(), "checkpoint": os.path.abspath(args.ckpt),
           "preset": ck.config.get("deepinfer_preset", "?"), "hbm_read_Bps": HBM_READ_BPS,
           "fp8_peak_flops": FP8_PEAK_FLOPS, "impl": impl, "layers": []}
    log(f"# torch_layer: {doc['gpu']}, torch {doc['torch']}, preset {doc['preset']}, impl {impl}")
    for L in layers:
        t0 = time.time()
        entry = {"layer": L, "role": role_name(tc, L), "results": [], "errors": []}
        doc["layers"].append(entry)
        try:
            layer = Layer(ck, L, tc)
        except Exception as e:  # noqa: BLE001
            entry["errors"].append(f"load: {type(e).__name__}: {e}")
            log(f"layer {L}: load failed: {e}")
            continue
        entry["load_s"] = time.time() - t0
        log(f"== layer {L} ({entry['role']}), loaded in {entry['load_s']:.1f} s, "
            f"{torch.cuda.memory_allocated() / 1e9:.1f} GB on the GPU")
        shapes = [("decode", B, c) for c in ctxs for B in batches] + [("prefill", args.prefill, 0)]
        for mode, n, c in shapes:
            try:
                with torch.no_grad():
                    r = bench_decode(layer, n, c, args, impl) if mode == "decode" else bench_prefill(layer, n, args,
                                                                                                      impl)
                entry["results"].append(r)
                if mode == "decode":
                    log(f"  decode B={n:<4} ctx={c:<6} {r['time_ms']:8.3f} ms  {r['must_read_bytes'] / 1e6:9.1f} MB "
                        f"{r['achieved_TBps']:6.2f} TB/s  {100 * r['hbm_roofline_ratio']:5.1f}% of HBM  "
                        f"experts {r['distinct_experts']}  graph {r['cuda_graph']}")
                else:
                    log(f"  prefill T={n:<5}          {r['time_ms']:8.3f} ms  {r['tflops']:7.1f} TFLOP/s  "
                        f"{100 * r['fp8_peak_ratio']:5.1f}% of FP8 peak")
            except Exception as e:  # noqa: BLE001
                msg = f"{mode} {n} {c}: {type(e).__name__}: {str(e)[:300]}"
                entry["errors"].append(msg)
                log("  error: " + msg)
            torch.cuda.empty_cache()
        del layer
        gc.collect()
        torch.cuda.empty_cache()
        if args.partial:
            with open(args.partial, "w") as f:
                json.dump(doc, f, indent=1)
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    return 0 if all(not e["errors"] for e in doc["layers"]) else 1


if __name__ == "__main__":
    sys.exit(main())
