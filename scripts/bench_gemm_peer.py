#!/usr/bin/env python3
"""PyTorch peer of tests/cuda/test_cuda_gemm_fast --bench: torch._scaled_mm (FP8 e4m3, row-wise f32
scales, bf16 out; PyTorch's fastest scaled FP8 GEMM on Hopper) at the same V4.1 shapes and M.

Per-32 block scales (the V4.1 contract) have no _scaled_mm mode on Hopper, so this is the speed a
row-scaled FP8 GEMM reaches, not the same function. FP4 expert shapes run as FP8 here (no FP4 tensor
cores on Hopper). Decode weights rotate over >= 256 MB of copies so reads come from HBM, as in the C
bench. Timing: CUDA events, median of 30 after 3 warm-up calls.

Usage (on the device machine): python3 scripts/bench_gemm_peer.py [--prefill]
  --prefill: the M = 8192 shapes (128 for the expert shapes), and the expert shapes at M = 49152, the
  rows of 8192 tokens x top-6 as one dense GEMM (the FLOPs of the C bench's grouped expert GEMM)
"""
import sys

import torch

SHAPES = [  # (name, fp4, N, K) as in tests/cuda/test_cuda_gemm_fast.c
    ("wq_a", 0, 1280, 5120), ("wq_b", 0, 32768, 1280), ("wkv", 0, 512, 5120), ("wo_b", 0, 5120, 8192),
    ("shared w1", 0, 2304, 5120), ("shared w2", 0, 5120, 2304), ("indexer wq_b", 0, 4096, 1280),
    ("expert w1/w3", 1, 2304, 5120), ("expert w2", 1, 5120, 2304),
]
PEAK_TFLOPS, HBM_GBS = 1445.0, 4470.0
REPS = 30


def median_ms(fn, n_calls):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPS)]
    for i in range(3):
        fn(i % n_calls)
    for r in range(REPS):
        ev[r][0].record()
        fn(r % n_calls)
        ev[r][1].record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return t[REPS // 2]


def bench(name, fp4, n, k, m):
    dev = "cuda"
    wbytes = n * k + n * 4  # e4m3 codes + one f32 scale per row
    copies = 1 if m > 256 else max(1, min(64, (256 << 20) // wbytes))
    ws = [(torch.randn(n, k, device=dev) * 160).clamp(-448, 448).to(torch.float8_e4m3fn) for _ in range(copies)]
    sw = [torch.rand(1, n, device=dev, dtype=torch.float32) * 1e-3 + 1e-3 for _ in range(copies)]
    x = (torch.randn(m, k, device=dev) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    sx = torch.rand(m, 1, device=dev, dtype=torch.float32) + 0.5

    def call(i):
        return torch._scaled_mm(x, ws[i].t(), scale_a=sx, scale_b=sw[i], out_dtype=torch.bfloat16)

    try:
        ms = median_ms(call, copies)
    except RuntimeError as e:  # a shape _scaled_mm refuses (e.g. an M it does not support)
        print(f"PEER {name} M{m}: _scaled_mm refused: {str(e).splitlines()[0]}", flush=True)
        return
    flop = 2.0 * m * n * k
    nbytes = n * k + n * 4 + m * k + m * 4 + m * n * 2
    tf, gbs = flop / ms * 1e-9, nbytes / ms * 1e-6
    print(f"PEER {'fp4' if fp4 else 'fp8'} {name:<13} M{m:<5} N{n:<6} K{k:<5} _scaled_mm {ms:8.4f} ms "
          f"{tf:7.1f} TFLOP/s ({tf / PEAK_TFLOPS * 100:4.1f}% of {PEAK_TFLOPS:.0f}) "
          f"{gbs:6.0f} GB/s ({gbs / HBM_GBS * 100:4.1f}% of {HBM_GBS:.0f})", flush=True)
    del ws, sw, x


def main():
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    ms = median_ms(lambda i: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), 1)
    print(f"PEER peak _scaled_mm 8192^3 per-tensor: {ms:.4f} ms {2 * 8192**3 / ms * 1e-9:.1f} TFLOP/s")
    del a, b
    for name, fp4, n, k in SHAPES:
        bench(name, fp4, n, k, 8192)
    bench(*SHAPES[7], 128)
    bench(*SHAPES[8], 128)
    if "--prefill" in sys.argv[1:]:
        bench(*SHAPES[7], 49152)
        bench(*SHAPES[8], 49152)
        return
    for m in (1, 8, 64):
        for name, fp4, n, k in SHAPES:
            bench(name, fp4, n, k, m)


if __name__ == "__main__":
    main()
