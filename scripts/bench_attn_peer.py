#!/usr/bin/env python3
"""PyTorch peer of the sparse-attention benchmark in tests/cuda/test_cuda_attn_fast.c.

The same op and shapes, written the way a fast PyTorch implementation would: gather the listed KV rows
(one shared 512-wide latent head), then either
  matmul  bf16 Q·Kᵀ (f32 scores), −inf for −1 slots, the sink as an extra logit column, softmax, bf16 P·V;
  graph   the matmul version captured in one CUDA graph (no launch gaps: its GPU time alone);
  sdpa    F.scaled_dot_product_attention over the gathered rows plus one zero row whose additive mask
          is the sink (exp(sink) joins the denominator, its value row is 0), enable_gqa for the single
          KV head.
Shapes: q [m, 64, 512] bf16, 640 indices per query (128 window ring slots + 512 ascending compressed
entries), decode m = 1, 8, 64, 256 at contexts 4K / 64K (ratio-2 pools of ctx/2 entries per sequence,
inside a 256 MB pool), and an 8192-token prefill (window p−127 … p, top-512 of (p+1)/2 visible entries,
−1 padding). Timing: CUDA events around the op alone, median, with a 256 MB buffer read before each
launch (a cold L2 of clean lines), as in the C benchmark. Bytes: q + valid gathered rows + idx + out.

Usage: python3 scripts/bench_attn_peer.py   (needs a CUDA GPU; prints one table)
"""
import torch
import torch.nn.functional as F

NH, DIM, HBM_TBS = 64, 512, 4.47
SCALE = DIM ** -0.5
dev = "cuda"
gen = torch.Generator(device=dev).manual_seed(1)
POOL_CMP = 262144
pool = torch.randn(POOL_CMP + 256 * 128, DIM, device=dev, generator=gen).to(torch.bfloat16)
flush = torch.zeros(64 << 20, dtype=torch.float32, device=dev)  # 256 MB, READ before each launch (clean cold L2)


def decode_idx(m, ctx):
    n_seq, stride = ctx // 2, ctx // 2 // 512
    i = torch.arange(m, device=dev)[:, None]
    slot = torch.randint(0, 128, (m, 1), device=dev, generator=gen)
    win = POOL_CMP + i * 128 + (slot + 1 + torch.arange(128, device=dev)) % 128  # ring order, oldest first
    e = torch.arange(512, device=dev) * stride + torch.randint(0, stride, (m, 512), device=dev, generator=gen)
    cmp = (i * n_seq + e) % POOL_CMP
    return torch.cat([win, cmp], 1).to(torch.int64)  # rows of `pool` (window rows live after the compressed)


def prefill_idx(T):
    p = torch.arange(T, device=dev)[:, None]
    win = p - 127 + torch.arange(128, device=dev)
    win = torch.where(win < 0, torch.full_like(win, -1), win)
    vis = (p + 1) // 2
    j = torch.arange(512, device=dev)
    stride = torch.clamp(vis // 512, min=1)
    r = torch.randint(0, 1 << 30, (T, 512), device=dev, generator=gen) % stride
    cmp = torch.where(vis <= 512, torch.where(j < vis, T + j, torch.full_like(j, -1)), T + j * stride + r)
    return torch.cat([win, cmp], 1).to(torch.int64)  # rows of `pool`: prompt rows 0..T-1, compressed T..


def attn_matmul(q, idx, sink):
    kv = pool[idx.clamp(min=0)]                                   # [m, n, 512] gathered
    s = torch.matmul(q, kv.transpose(1, 2)).float() * SCALE       # [m, 64, n]
    s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
    s = torch.cat([s, sink.view(1, NH, 1).expand(q.shape[0], NH, 1)], -1)
    p = torch.softmax(s, -1)[..., :-1]
    return torch.matmul(p.to(torch.bfloat16), kv)                 # [m, 64, 512]


def attn_sdpa(q, idx, sink):
    m, n = idx.shape
    kv = pool[idx.clamp(min=0)]
    kv = torch.cat([kv, kv.new_zeros(m, 1, DIM)], 1)[:, None]     # [m, 1, n+1, 512], last row = sink slot
    bias = torch.zeros(m, NH, 1, n + 1, device=dev, dtype=torch.bfloat16)
    bias[..., :n] = torch.where(idx < 0, float("-inf"), 0.0).to(torch.bfloat16)[:, None, None, :]
    bias[..., n] = sink.to(torch.bfloat16).view(1, NH, 1)
    o = F.scaled_dot_product_attention(q[:, :, None], kv, kv, attn_mask=bias, scale=SCALE, enable_gqa=True)
    return o[:, :, 0]


def graphed(fn, q, idx, sink):
    """fn(q, idx, sink) captured in a CUDA graph (no launch gaps between its kernels): the replay callable."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(q, idx, sink)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(q, idx, sink)
    return g.replay


def median_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    ts = []
    for r in range(reps):
        flush.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    print(f"# device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'shape':34s} {'bytes':>11s} | {'matmul us':>10s} {'GB/s':>7s} {'TFLOP/s':>7s} | "
          f"{'graph us':>10s} {'GB/s':>7s} {'TFLOP/s':>7s} | "
          f"{'sdpa us':>10s} {'GB/s':>7s} {'TFLOP/s':>7s} | max|matmul-sdpa|")
    cases = [(f"decode m={m} ctx {ctx >> 10}K", m, ctx) for ctx in (4096, 65536) for m in (1, 8, 64, 256)]
    cases.append(("prefill m=8192 (T=8192)", 8192, 0))
    for name, m, ctx in cases:
        idx = prefill_idx(m) if ctx == 0 else decode_idx(m, ctx)
        q = torch.randn(m, NH, DIM, device=dev, generator=gen).to(torch.bfloat16)
        sink = torch.rand(NH, device=dev, generator=gen) * 2 - 0.5
        n_valid = int((idx >= 0).sum())
        nbytes = m * NH * DIM * 2 * 2 + n_valid * DIM * 2 + idx.numel() * 4  # idx counted as int32, like the C op
        flop = 4.0 * NH * DIM * n_valid
        reps = 5 if m > 256 else 21
        row = [f"{name:34s} {nbytes / 1e6:8.1f} MB"]
        outs = []
        for fn in (attn_matmul, "graph", attn_sdpa):
            try:
                if fn == "graph":  # the matmul version as one CUDA graph replay
                    replay = graphed(attn_matmul, q, idx, sink)
                    t = median_ms(replay, reps)
                    del replay
                    torch.cuda.empty_cache()
                    row.append(f"{t * 1e3:10.1f} {nbytes / (t * 1e-3) / 1e9:7.0f} {flop / (t * 1e-3) / 1e12:7.2f}")
                    continue
                t = median_ms(lambda: fn(q, idx, sink), reps)
                outs.append(fn(q, idx, sink).float())
                row.append(f"{t * 1e3:10.1f} {nbytes / (t * 1e-3) / 1e9:7.0f} {flop / (t * 1e-3) / 1e12:7.2f}")
            except Exception as e:  # e.g. out of memory or no SDPA kernel for this shape
                if fn != "graph":
                    outs.append(None)
                row.append(f"{'failed':>10s} {type(e).__name__:>15s}")
        diff = (outs[0] - outs[1]).abs().max().item() if outs[0] is not None and outs[1] is not None else float("nan")
        print(" | ".join(row) + f" | {diff:.3g}", flush=True)
        del q, idx, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
