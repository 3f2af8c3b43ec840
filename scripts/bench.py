"""Benchmarks, printed as figures (never asserted):

    /usr/bin/python3 scripts/bench.py cpu   ./train against PyTorch on the same model, data,
                                            machine and threads (1 and all cores), alternating over
                                            several repetitions; and the cost of telemetry
    /usr/bin/python3 scripts/bench.py gpu   the d22 model at T = 2048 on the GPU: tokens/s, ms/step,
                                            MFU, a per-phase breakdown, telemetry every step vs never

Each figure is the median over the timed steps (the first steps, which warm up, are left out), and
every comparison is measured within the one invocation, on the same machine.
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "test"))
import attnlog  # noqa: E402


def run_train(args, out_dir, extra, threads=None):
    """Runs ./train; returns (median ms per step after warm-up, profile lines, log)."""
    threads = threads or max(args.threads)
    cmd = [os.path.join(ROOT, "train"), "-o", out_dir, "-g", "0", "-v", "0", "--val-batches", "1",
           "--threads", str(threads)] + extra
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: ./train failed ({' '.join(cmd)}):\n{proc.stdout[-2000:]}")
    log = attnlog.open_log(os.path.join(out_dir, "run.attnlog"))
    steps, ms = log.scalars("ms")
    timed = [float(x) for x in ms[args.warmup:]]
    profile = [line for line in proc.stdout.splitlines() if line.startswith("profile")]
    return timed, profile, log


def bench_torch(args, c, B, T, threads):
    """The PyTorch model (scripts/model_torch.py) training the same model on the same shard with the
    reference's optimiser (test/reference.py): the ms of each step after the warm-up."""
    import numpy as np
    import torch
    import model_torch
    import reference
    torch.set_num_threads(threads)
    shard = os.path.join(ROOT, args.data_dir, "train_000000.bin")
    header = np.fromfile(shard, dtype="<i4", count=256)
    tokens = np.fromfile(shard, dtype="<u2" if header[1] == 1 else "<u4", offset=1024).astype(np.int64)
    p = {n: t.clone().requires_grad_(True) for n, t in model_torch.init_params(c, 1337).items()}
    opt, _ = reference.make_optimizer(p, 0.1, frozen=())
    times = []
    for step in range(args.steps):
        start = step * B * T
        chunk = torch.from_numpy(tokens[start:start + B * T + 1])
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = model_torch.forward(p, c, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        for group in opt.param_groups:
            group["lr"] = 1e-3
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times[args.warmup:]


def vector_isa():
    """The widest x86 vector instruction set the processor has (/proc/cpuinfo's flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        flags = set()
    return next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"))
                 if flag in flags), "unknown")


def blas_kernels():
    """The kernels OpenBLAS chose for this processor (its core name), as ./train loads it."""
    import ctypes
    import glob
    for path in glob.glob("/usr/lib/*/openblas-openmp/libopenblas.so*"):
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return "unknown"


def spread(ms):
    """'median X ms (min Y)' of a list of step times."""
    return f"{statistics.median(ms):8.1f} ms/step median, {min(ms):8.1f} min"


def cpu(args):
    """./train against PyTorch at each thread count, the two alternating over several repetitions
    (on a noisy machine one run of each is not a comparison), and the cost of telemetry."""
    import model_torch
    import torch
    B, T = 8, 256
    usage = re.search(r"CPU capability usage: (\w+)", torch.__config__.show())
    capability = usage.group(1) if usage else "unknown"
    print(f"CPU benchmark: d6 preset, batch {B} x {T} tokens, {args.steps} steps a run ({args.warmup} warm-up steps "
          f"left out), {args.repeats} repetitions alternating ./train and PyTorch {torch.__version__}")
    print(f"  processor: {cpu_name()}; vector instructions: {vector_isa()}; OpenBLAS kernels: {blas_kernels()}; "
          f"PyTorch kernels: {capability}")
    tok = B * T
    for threads in args.threads:
        ours, theirs, with_stats, without_stats = [], [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            def run_ours(rep):
                timed, _, log = run_train(args, os.path.join(tmp, f"never{rep}"),
                                          ["-x", str(args.steps), "-b", str(B), "-t", str(T), "-s", "0"], threads)
                ours.extend(timed)
                return log

            log = run_ours("first")
            cfg = log.config
            c = model_torch.Config(cfg["vocab_size"], cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"],
                                   cfg["head_dim"], cfg["d_ff"], cfg["max_seq_len"])
            ours.clear()
            for rep in range(args.repeats):
                order = [lambda: run_ours(rep), lambda: theirs.extend(bench_torch(args, c, B, T, threads))]
                for step in (order if rep % 2 == 0 else order[::-1]):
                    step()
                # Telemetry cost inside one run: statistics on every second step, so steps with and
                # without them alternate under the same conditions.
                _, profile, _ = run_train(args, os.path.join(tmp, f"alternate{rep}"),
                                          ["-x", str(2 * args.steps), "-b", str(B), "-t", str(T), "-s", "2", "--profile",
                                           "1"], threads)
                for line in profile:  # "profile, steps with(out) statistics (N steps): ... step X ms"
                    ms = float(line.rsplit("step", 1)[1].split("ms")[0])
                    (with_stats if "with statistics" in line else without_stats).append(ms)
        print(f"{threads} thread{'s' if threads > 1 else ''}:")
        print(f"  ./train (no telemetry)  {spread(ours)}  {tok / statistics.median(ours) * 1e3:8.0f} tokens/s")
        print(f"  PyTorch                 {spread(theirs)}  {tok / statistics.median(theirs) * 1e3:8.0f} tokens/s")
        print(f"  ./train is {statistics.median(theirs) / statistics.median(ours):.2f}x the speed of PyTorch "
              f"(medians; {min(theirs) / min(ours):.2f}x on the fastest steps)")
        extra = statistics.median(with_stats) - statistics.median(without_stats)
        base = statistics.median(without_stats)
        print(f"  telemetry: +{extra:.1f} ms per stats step ({len(with_stats)} runs with statistics on every second "
              f"step); every step {1 + extra / base:.4f}x, every 10 steps {1 + extra / 10 / base:.4f}x (the default)")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def bench_torch_gpu(args, cfg, B, T, steps):
    """The same model written the way a PyTorch user would for speed on a GPU: bf16 autocast,
    fused scaled-dot-product attention, fused AdamW (optionally torch.compile). Needs PyTorch >= 2.5.
    Returns median ms per step, or None when this PyTorch lacks what it needs."""
    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available() or not hasattr(F, "rms_norm"):
        return None
    dev = "cuda"
    L, H, Hkv, D, C, Fd, V = (cfg[k] for k in ("n_layer", "n_head", "n_kv_head", "head_dim", "d_model", "d_ff", "vocab_size"))
    g = torch.Generator(device="cpu").manual_seed(1)
    mk = lambda *shape, std=0.02: (torch.randn(*shape, generator=g) * std).to(dev).requires_grad_(True)
    ones = lambda n: torch.ones(n, device=dev, requires_grad=True)
    wte = mk(V, C)
    layers = [dict(attn_norm=ones(C), wqkv=mk((H + 2 * Hkv) * D, C), q_gain=ones(D), k_gain=ones(D),
                   wo=mk(C, H * D, std=0.02 / math.sqrt(2 * L)), mlp_norm=ones(C), w13=mk(2 * Fd, C),
                   w2=mk(C, Fd, std=0.02 / math.sqrt(2 * L))) for _ in range(L)]
    final_norm = ones(C)
    params = [wte, final_norm] + [t for layer in layers for t in layer.values()]
    inv = 10000.0 ** (-torch.arange(0, D, 2, device=dev, dtype=torch.float64) / D)
    ang = torch.arange(T, device=dev, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = ang.cos().float()[None, None], ang.sin().float()[None, None]

    def rope(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def norm(x, gain):  # the gain in the activations' dtype, so that the fused kernel applies
        return F.rms_norm(x, (x.shape[-1],), gain.to(x.dtype), 1e-5)

    def forward(tokens, targets):
        x = wte[tokens]
        for p in layers:
            h = norm(x, p["attn_norm"])
            q, k, v = (h @ p["wqkv"].T).split([H * D, Hkv * D, Hkv * D], dim=-1)
            q = norm(q.view(B, T, H, D), p["q_gain"]).transpose(1, 2)
            k = norm(k.view(B, T, Hkv, D), p["k_gain"]).transpose(1, 2)
            v = v.view(B, T, Hkv, D).transpose(1, 2)
            y = F.scaled_dot_product_attention(rope(q).to(v.dtype), rope(k).to(v.dtype), v, is_causal=True,
                                               enable_gqa=Hkv != H)
            x = x + y.transpose(1, 2).reshape(B, T, H * D) @ p["wo"].T
            h = norm(x, p["mlp_norm"])
            a, b = (h @ p["w13"].T).chunk(2, dim=-1)
            x = x + (F.silu(a) * b) @ p["w2"].T
        logits = norm(x, final_norm) @ wte.T
        return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))

    step_fn = torch.compile(forward) if args.torch_compile else forward
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    tokens = torch.randint(0, V, (B, T + 1), device=dev)
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[args.warmup + (3 if args.torch_compile else 0):])


def gpu(args):
    B, T = args.batch, 2048
    extra = ["-m", "d22", "-x", str(args.steps), "-b", str(B), "-t", str(T), "--profile", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        never, prof_never, log = run_train(args, os.path.join(tmp, "never"), extra + ["-s", "0"])
        every, prof_every, _ = run_train(args, os.path.join(tmp, "every"), extra + ["-s", "1"])
    ms_never, ms_every = statistics.median(never), statistics.median(every)
    cfg = log.config
    L, H, D, C, F, V = cfg["n_layer"], cfg["n_head"], cfg["head_dim"], cfg["d_model"], cfg["d_ff"], cfg["vocab_size"]
    Hkv = cfg["n_kv_head"]
    n_params = V * C + L * (2 * C + (H + 2 * Hkv) * D * C + 2 * D + C * H * D + 3 * F * C) + C
    flops_per_token = 6 * n_params + 12 * L * H * D * T  # 6N for the matrices, 12 L H D T for attention
    tok = B * T
    tps = tok / ms_never * 1e3
    mfu = flops_per_token * tps / 989e12
    print(f"GPU benchmark on {log.header.get('device')}: d22, batch {B} x {T}, {args.steps} steps "
          f"({args.warmup} warm-up left out)")
    print(f"  {ms_never:.1f} ms/step, {tps:,.0f} tokens/s, MFU {100 * mfu:.1f}% "
          f"({flops_per_token / 1e6:.0f} MFLOP/token, H100 dense bf16 peak 989 TFLOP/s)")
    for line in prof_never + prof_every:
        print("  " + line)
    print(f"  telemetry every step: {ms_every:.1f} ms/step, {ms_every / ms_never:.3f}x the step without it")
    ms_torch = bench_torch_gpu(args, cfg, B, T, args.steps)
    if ms_torch is None:
        print("  PyTorch comparison: skipped (needs CUDA PyTorch >= 2.5 for fused RMSNorm and GQA attention)")
    else:
        import torch
        how = "torch.compile" if args.torch_compile else "eager"
        print(f"  PyTorch {torch.__version__} ({how}, bf16 autocast, SDPA, fused AdamW): {ms_torch:.1f} ms/step, "
              f"{tok / ms_torch * 1e3:,.0f} tokens/s; ./train is {ms_torch / ms_never:.2f}x its speed")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["cpu", "gpu"])
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (default: 12 on the CPU, 30 on the GPU)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--threads", type=lambda v: [int(t) for t in v.split(",")], default=sorted({1, os.cpu_count()}),
                    help="CPU: thread counts to compare at, comma-separated (default: 1 and every core)")
    ap.add_argument("--repeats", type=int, default=3, help="CPU: repetitions, alternating ./train and PyTorch")
    ap.add_argument("--batch", type=int, default=8, help="GPU micro-batch size")
    ap.add_argument("--data-dir", default="data/brown", help="the prepared default corpus (./train prepares it)")
    ap.add_argument("--torch-compile", action="store_true", help="GPU: also compile the PyTorch model")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(ROOT, "train")):
        sys.exit("error: ./train is missing: run 'make train' first")
    if args.steps is None:
        args.steps = 12 if args.what == "cpu" else 30
    if args.steps <= args.warmup:
        sys.exit("error: --steps must be larger than --warmup")
    cpu(args) if args.what == "cpu" else gpu(args)


if __name__ == "__main__":
    main()
