"""Benchmarks, printed as figures (never asserted):

    /usr/bin/python3 scripts/bench.py cpu   ./train against PyTorch on the same model, data,
                                            machine and threads (1 and all cores), alternating over
                                            several repetitions; and the cost of telemetry
    /usr/bin/python3 scripts/bench.py gpu   the d22 model at T = 2048 on the GPU, batch 8 and 4: ./train
                                            and PyTorch (eager, torch.compile) with statistics never,
                                            every 10 steps and every step, in one table each; tokens/s,
                                            ms/step, MFU, ratios, ./train's phases; --kernels adds the
                                            per-kernel times of the dev/cuda checks
    /usr/bin/python3 scripts/bench.py mpi   data-parallel scaling on the CPU: the same global batch
                                            by 1 process (gradient accumulation) and by N processes
                                            under mpirun, one thread each; tokens/s, per process,
                                            and the scaling efficiency

The CPU figures are medians over the timed steps, the GPU rows means (so that stats steps count
with their share); the first steps, which warm up, are left out. Every comparison is measured
within the one invocation, on the same machine.
"""
import argparse
import glob
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import attnlog
from attnlog.commands import ArgumentParser, UserError, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.environ.get("TRAIN_BIN", os.path.join(ROOT, "train"))  # dev/gpu_bundle.sh's build/gpu/bin/train on a GPU machine


def run_train(args, out_dir, extra, threads=None, launch=()):
    """Runs ./train (after `launch`, e.g. mpirun's command); returns (the ms of each step after the
    warm-up, its lines of profile and, on a GPU, of what runs its attention (cuDNN, from where, or its
    own kernels), log)."""
    threads = threads or max(args.threads)
    data = os.path.join(ROOT, args.data_dir)
    cmd = [*launch, TRAIN, "-i", os.path.join(data, "train_*.bin"), "-j", os.path.join(data, "val_*.bin"), "-o", out_dir,
           "-g", "0", "-v", "0", "--val-batches", "1", "--threads", str(threads)] + extra
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        said = proc.stdout.strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"./train failed with status {proc.returncode} ({said[0]}): {' '.join(cmd)}")
    log = attnlog.open_log(os.path.join(out_dir, "run.attnlog"))
    steps, ms = log.scalars("ms")
    timed = [float(x) for x in ms[args.warmup:]]
    profile = [line for line in proc.stdout.splitlines() if line.startswith(("profile", "attention"))]
    return timed, profile, log


def bench_torch(args, c, B, T, threads):
    """The PyTorch model (attnlog.model_torch) training the same model on the same shard with its
    AdamW (model_torch.make_optimizer): the ms of each step after the warm-up."""
    import torch
    from attnlog import model_torch, probe
    torch.set_num_threads(threads)
    tokens = probe.read_shard(os.path.join(ROOT, args.data_dir, "train_000000.bin"))
    p = {n: t.clone().requires_grad_(True) for n, t in model_torch.init_params(c, 1337).items()}
    opt, _ = model_torch.make_optimizer(p, 0.1, frozen=())
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
    import torch
    from attnlog import model_torch
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


def mpi(args):
    """Data-parallel scaling on the CPU: the global batch of N micro-batches of 8 x 256 taken by one
    process (gradient accumulation) and by N processes (one micro-batch each), one thread per
    process, alternating over the repetitions."""
    import shutil
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise UserError("no mpirun (Open MPI: apt-get install openmpi-bin)")
    B, T, N = 8, 256, max(args.processes)
    print(f"CPU data-parallel benchmark: d6 preset, micro-batch {B} x {T}, global batch {N} micro-batches "
          f"({N * B * T} tokens), one thread per process, {args.steps} steps a run ({args.warmup} warm-up steps left "
          f"out), {args.repeats} repetitions; processor: {cpu_name()}, {os.cpu_count()} cores")
    launch_flags = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
    medians = {n: [] for n in args.processes}
    threaded = []  # for comparison: one process with N threads
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for n in (args.processes if rep % 2 == 0 else args.processes[::-1]):
                launch = [mpirun, *launch_flags, "-np", str(n)] if n > 1 else []
                timed, _, _ = run_train(args, os.path.join(tmp, f"{n}-{rep}"),
                                        ["-x", str(args.steps), "-b", str(B), "-t", str(T), "-d", str(N * B * T),
                                         "-s", "0"], 1, launch)
                medians[n].append(statistics.median(timed))
            timed, _, _ = run_train(args, os.path.join(tmp, f"threads-{rep}"),
                                    ["-x", str(args.steps), "-b", str(B), "-t", str(T), "-d", str(N * B * T), "-s", "0"],
                                    N)
            threaded.append(statistics.median(timed))
    tok = N * B * T
    base = statistics.median(medians[min(args.processes)]) * min(args.processes)
    for n in args.processes:
        ms = statistics.median(medians[n])
        print(f"  {n} process{'es' if n > 1 else '  '}  {ms:8.1f} ms/step  {tok / ms * 1e3:8.0f} tokens/s  "
              f"{tok / ms * 1e3 / n:8.0f} tokens/s per process  scaling efficiency {base / (ms * n):.2f}")
    ms = statistics.median(threaded)
    print(f"  for comparison, 1 process of {N} threads: {ms:8.1f} ms/step  {tok / ms * 1e3:8.0f} tokens/s")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


STATS_CADENCES = [("never", 0), ("every 10 steps", 10), ("every step", 1)]
GRAPH_STEPS = 20  # the second step with statistics every 10 steps: its pass's CUDA graph captured


def reports_statistics(k, scores):
    """The statistics the research reports compute with hooks, as a PyTorch user writes them: per kv
    head the post-norm keys' mean L2 norm, largest |component| and participation ratio (as a forward
    hook on the k norm computes them), per query head the attention entropy of the materialised
    causal softmax.
    k: [B, Hkv, T, D] before RoPE; scores: [B, H, T, T] logits, -inf above the diagonal."""
    import torch
    k = k.float()
    sq = k.pow(2).sum(-1)
    p = torch.softmax(scores.float(), dim=-1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
    return [sq.sqrt().mean((0, 2)), k.abs().amax(-1).mean((0, 2)), (sq.pow(2) / k.pow(4).sum(-1)).mean((0, 2)),
            entropy.mean((0, 2))]


def bench_torch_gpu(args, cfg, B, T, steps, compiled, cadences, report=None):
    """The same model written the way a PyTorch user would for speed on a GPU: bf16 autocast,
    fused scaled-dot-product attention, fused AdamW, optionally torch.compile; on stats steps (every
    `every` steps, 0: never) the forward also computes reports_statistics and the step copies them to
    the host. Needs PyTorch >= 2.5. One run of `steps` steps for each statistics cadence of
    `cadences`, in that order, on one model and one compiled step (torch.compile compiles the step
    with and without statistics once each, for all the runs). Returns {every: the mean ms per step
    after the warm-up, stats steps included in their share}, each also handed to report(every, ms)
    as it is measured; None when this PyTorch lacks what it needs."""
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
    causal = torch.ones(T, T, device=dev, dtype=torch.bool).tril()

    def rope(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def norm(x, gain):  # the gain in the activations' dtype, so that the fused kernel applies
        return F.rms_norm(x, (x.shape[-1],), gain.to(x.dtype), 1e-5)

    def forward(tokens, targets, with_stats):
        x, stats = wte[tokens], []
        for p in layers:
            h = norm(x, p["attn_norm"])
            q, k, v = (h @ p["wqkv"].T).split([H * D, Hkv * D, Hkv * D], dim=-1)
            q = norm(q.view(B, T, H, D), p["q_gain"]).transpose(1, 2)
            k = norm(k.view(B, T, Hkv, D), p["k_gain"]).transpose(1, 2)
            v = v.view(B, T, Hkv, D).transpose(1, 2)
            qr, kr = rope(q).to(v.dtype), rope(k).to(v.dtype)
            if with_stats:  # what a hook on the k norm and a materialised attention matrix give
                scores = (qr @ kr.repeat_interleave(H // Hkv, dim=1).transpose(-1, -2)) / math.sqrt(D)
                stats += reports_statistics(k.detach(), scores.detach().masked_fill(~causal, float("-inf")))
            y = F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=Hkv != H)
            x = x + y.transpose(1, 2).reshape(B, T, H * D) @ p["wo"].T
            h = norm(x, p["mlp_norm"])
            a, b = (h @ p["w13"].T).chunk(2, dim=-1)
            x = x + (F.silu(a) * b) @ p["w2"].T
        logits = norm(x, final_norm) @ wte.T
        return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1)), stats

    step_fn = torch.compile(forward) if compiled else forward
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    tokens = torch.randint(0, V, (B, T + 1), device=dev)
    graphs_compiled = set()  # which of the two steps (with statistics or not) torch.compile has made
    means = {}
    for every in cadences:
        times = []
        for step in range(steps):
            with_stats = every > 0 and step % every == 0
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss, stats = step_fn(tokens[:, :-1], tokens[:, 1:], with_stats)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            if stats:
                torch.cat(stats).cpu()  # the host copy a hook-based recipe makes to log them
            end.record()
            torch.cuda.synchronize()
            compiling = compiled and with_stats not in graphs_compiled  # its time is the compiler's: left out
            graphs_compiled.add(with_stats)
            if step >= args.warmup and not compiling:
                times.append(start.elapsed_time(end))
        means[every] = statistics.mean(times)
        if report:
            report(every, means[every])
    return means


def kernel_table():
    """The kernel checks of dev/cuda (build/dev_* or build/gpu/bin/dev_*) at the reports' shapes: the
    timing line of every kernel, by family."""
    binaries = sorted(glob.glob(os.path.join(ROOT, "build", "gpu", "bin", "dev_*"))) or \
        sorted(glob.glob(os.path.join(ROOT, "build", "dev_*")))
    if not binaries:
        print("  per-kernel times: no dev/cuda binaries (make build/dev_attention ..., or dev/gpu_bundle.sh)")
        return
    print("  per-kernel times (dev/cuda checks, CUDA events, medians):")
    for path in binaries:
        proc = subprocess.run([path], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = [line.strip() for line in proc.stdout.splitlines() if line.startswith("   ") and " ms" in line]
        print(f"    {os.path.basename(path)[4:]}:" + ("" if lines else f" no timings (status {proc.returncode})"))
        for line in lines:
            print(f"      {line}")


def gpu(args):
    T = 2048
    for B in args.batches:
        gpu_table(args, B, T)
    if args.kernels:
        kernel_table()


def gpu_table(args, B, T):
    """One table: ./train with statistics never / every 10 steps / every step; PyTorch eager and
    torch.compile likewise (the reports' statistics in the forward of stats steps); ms/step (means
    over the timed steps, so that stats steps count with their share), tokens/s, MFU, and ./train's
    speed over each PyTorch row at the same cadence."""
    # ./train also takes statistics on its last step: one step more, left out. It captures a pass's
    # CUDA graph the second time the pass runs, with statistics every 10 steps at step 20: a cost paid
    # once, as torch.compile's compilation is (left out of its rows), so its runs are GRAPH_STEPS
    # steps longer and leave them out first. Both programs time steps - warm-up steps, statistics on
    # a multiple of the cadence.
    extra = ["-m", "d22", "-x", str(args.steps + 1 + GRAPH_STEPS), "-b", str(B), "-t", str(T)]
    ours = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, every in STATS_CADENCES:
            timed, _, log = run_train(args, os.path.join(tmp, str(every)), extra + ["-s", str(every)])
            ours[every] = statistics.mean(timed[GRAPH_STEPS:-1])
    cfg = log.config
    L, H, D, C, F, V = cfg["n_layer"], cfg["n_head"], cfg["head_dim"], cfg["d_model"], cfg["d_ff"], cfg["vocab_size"]
    Hkv = cfg["n_kv_head"]
    n_params = V * C + L * (2 * C + (H + 2 * Hkv) * D * C + 2 * D + C * H * D + 3 * F * C) + C
    flops_per_token = 6 * n_params + 12 * L * H * D * T  # 6N for the matrices, 12 L H D T for attention
    tok = B * T
    rows = [("./train", every, ms) for every, ms in ours.items()]
    try:
        import torch
    except ImportError:
        torch = None
    for compiled in (False, True):
        means = bench_torch_gpu(args, cfg, B, T, args.steps, compiled, [every for _, every in STATS_CADENCES]) \
            if torch else None
        if means is None:
            break
        rows += [(f"PyTorch {torch.__version__} {'torch.compile' if compiled else 'eager'}", every, ms)
                 for every, ms in means.items()]
    print(f"GPU benchmark on {log.header.get('device')}: d22, batch {B} x {T}, {args.steps} steps a run, "
          f"{args.warmup} warm-up left out (and ./train's first {GRAPH_STEPS} more, torch.compile's compiling steps); "
          f"MFU on {flops_per_token / 1e6:.0f} MFLOP/token against the H100's dense bf16 peak of 989 TFLOP/s")
    print(f"  {'':34} {'statistics':>15} {'ms/step':>8} {'tokens/s':>10} {'MFU':>6}  ./train's speed over it")
    cadence = dict((every, name) for name, every in STATS_CADENCES)
    for who, every, ms in rows:
        ratio = "" if who == "./train" else f"{ms / ours[every]:.2f}x (same statistics), {ms / ours[0]:.2f}x (./train without)"
        print(f"  {who:34} {cadence[every]:>15} {ms:8.1f} {tok / ms * 1e3:10,.0f} "
              f"{100 * flops_per_token * tok / ms * 1e3 / 989e12:5.1f}%  {ratio}")
    print(f"  statistics in ./train: every step {ours[1] / ours[0] - 1:+.2%} of a step, every 10 steps "
          f"{ours[10] / ours[0] - 1:+.2%}")
    if len(rows) == len(ours):
        print("  PyTorch rows: skipped (needs CUDA PyTorch >= 2.5 for fused RMSNorm and GQA attention)")
    with tempfile.TemporaryDirectory() as tmp:
        _, prof, _ = run_train(args, tmp, extra + ["-s", "0", "--profile", "1"])
    for line in prof:
        print("  " + line)


def main(argv=None):
    """The benchmark the command line names: its exit status (attnlog.commands)."""
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["cpu", "gpu", "mpi"])
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (default: 12 on the CPU, 30 on the GPU)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--threads", type=lambda v: [int(t) for t in v.split(",")], default=sorted({1, os.cpu_count()}),
                    help="CPU: thread counts to compare at, comma-separated (default: 1 and every core)")
    ap.add_argument("--repeats", type=int, default=3, help="CPU: repetitions, alternating ./train and PyTorch")
    ap.add_argument("--batch", dest="batches", type=lambda v: [int(b) for b in v.split(",")], default=[8, 4],
                    help="GPU: micro-batch sizes, one table each (default: 8,4)")
    ap.add_argument("--processes", type=lambda v: [int(n) for n in v.split(",")], default=sorted({1, os.cpu_count()}),
                    help="mpi: process counts to compare, comma-separated (default: 1 and every core)")
    ap.add_argument("--kernels", action="store_true", help="GPU: also the per-kernel times of the dev/cuda checks")
    ap.add_argument("--data-dir", default="data/brown", help="the prepared default corpus (./train prepares it)")
    return run(bench, ap.parse_args, argv)


def bench(args):
    if not os.path.exists(TRAIN):
        raise UserError(f"{TRAIN} is missing: run 'make train' first")
    if not glob.glob(os.path.join(ROOT, args.data_dir, "train_*.bin")):
        raise UserError(f"--data-dir {args.data_dir}: no training shards (./train prepares the default corpus on "
                        "first use)")
    if args.steps is None:
        args.steps = 32 if args.what == "gpu" else 12
    if args.steps <= args.warmup:
        raise UserError("--steps must be larger than --warmup")
    {"cpu": cpu, "gpu": gpu, "mpi": mpi}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
