"""Measured against simulated: a GPT-2-like model on one GPU, trained under slackswap plans.

    python benchmarks/gpu_validate.py            # about 1-3 minutes on an H100/H200-class GPU

1. Build a GPT-2-like model (bf16) and measure the plain training step: median step time
   (CUDA events) and the activation peak (torch.cuda.max_memory_allocated during the step,
   minus what was allocated before it).
2. Measure host<->device bandwidth with pinned buffers and make a Hardware from it.
3. Profile the step (slackswap.profile), plan with slackswap.plan at 50% of the simulated
   unconstrained peak with `slackswap` and with `full-recompute`, run each plan with both runtime
   backends (replay, and checkpoint where it accepts the plan; a refused plan prints why), and print
   measured against simulated step time and peak, the swap manager's counters, and the loss
   difference from plain training.

Exits with code 2 and one line on stderr when CUDA is not available.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per configuration")
    parser.add_argument("--budget", type=float, default=0.5)
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("gpu_validate: error: needs torch: pip install 'slackswap[torch]'", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_validate: error: needs a CUDA GPU (torch.cuda.is_available() is False); nothing was run",
              file=sys.stderr)
        return 2

    import slackswap
    from slackswap import Action, get_hardware, simulate
    from slackswap.examples import ExampleConfig, loss_fn, make_batch, make_example
    from slackswap.profiler import profile_model
    from slackswap.runtime import CheckpointBackendError, build_execution_map
    from slackswap.sim import simulate_ideal
    from slackswap.units import GB, format_bytes, format_seconds

    started = time.perf_counter()
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    config = ExampleConfig(vocab=args.vocab, seq_len=args.seq_len, hidden=args.hidden, heads=args.heads,
                           layers=args.layers, ffn=4 * args.hidden, dropout=0.1, micro_batch=args.micro_batch)
    model = make_example("gpt2", config, device=device, dtype=torch.bfloat16)
    batches = [make_batch(config, seed=s, device=device) for s in range(args.steps + 2)]
    print(f"model: GPT-2-like {config}")

    def run_steps(m, runtime=None):
        """Train steps; returns (median step time s, activation peak bytes, losses)."""
        opt = torch.optim.SGD(m.parameters(), lr=1e-4)
        torch.manual_seed(0)
        times, peaks, losses = [], [], []
        for i, batch in enumerate(batches):
            opt.zero_grad(set_to_none=False)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            with runtime if runtime is not None else contextlib.nullcontext():
                loss = loss_fn(m, batch)
                loss.backward()
            end.record()
            torch.cuda.synchronize()
            opt.step()
            losses.append(loss.item())
            if i >= 2:  # the first steps warm up kernels, the allocator and the pinned pool
                times.append(start.elapsed_time(end) / 1e3)
                peaks.append(torch.cuda.max_memory_allocated() - base)
        return statistics.median(times), max(peaks), losses

    # Warm up and give every parameter a gradient buffer, so the peaks below are activations.
    run_steps(model)
    ideal_time, ideal_peak, ideal_losses = run_steps(copy.deepcopy(model))
    print(f"plain training: step {format_seconds(ideal_time)}, activation peak {format_bytes(ideal_peak)}")

    # Host link bandwidth, pinned memory, 256 MiB each way.
    n = 256 * 2**20
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    rates = {}
    for label, (dst, src) in (("h2d", (dev, host)), ("d2h", (host, dev))):
        samples = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src, non_blocking=True)
            e.record()
            torch.cuda.synchronize()
            samples.append(n / (s.elapsed_time(e) / 1e3))
        rates[label] = statistics.median(samples[1:])
    del host, dev
    hardware = get_hardware("h200-pcie5").replace(
        name="measured", description="this GPU with measured host-link bandwidth",
        h2d_bytes_per_s=rates["h2d"], d2h_bytes_per_s=rates["d2h"],
    )
    print(f"host link: H2D {rates['h2d'] / GB:.1f} GB/s, D2H {rates['d2h'] / GB:.1f} GB/s (pinned, 256 MiB)")

    workload = profile_model(model, batches[0], loss_fn, warmup=1, repeats=3)
    sim_ideal = simulate_ideal(workload, hardware)
    budget = max(1, int(args.budget * sim_ideal.peak_memory_bytes))
    print(f"profile: {len(workload.ops)} ops, {format_bytes(workload.saved_bytes)} saved; simulated ideal step "
          f"{format_seconds(sim_ideal.step_time_s)}, peak {format_bytes(sim_ideal.peak_memory_bytes)}; "
          f"budget {format_bytes(budget)} ({args.budget:.0%})")

    rows = [("plain", ideal_time, sim_ideal.step_time_s, ideal_peak, sim_ideal.peak_memory_bytes, 0, 0, 0, 0.0, "")]
    for policy in ("slackswap", "full-recompute"):
        try:
            # slackswap.plan records, for a profiled workload, the step at which the simulation starts
            # each copy back (plan.info["copy_in_start_step"]); the runtime issues each copy then.
            plan = slackswap.plan(workload, hardware, budget=args.budget, policy=policy)
        except Exception as exc:  # report and go on: one policy failing must not hide the other
            print(f"{policy}: planning failed: {type(exc).__name__}: {exc}")
            continue
        emap = build_execution_map(workload, plan)
        sim = simulate(workload, hardware, plan)
        counts = "/".join(str(plan.count(a)) for a in Action)
        for backend in ("replay", "checkpoint"):
            label = f"{policy}/{backend}"
            m = copy.deepcopy(model)
            try:
                runtime = slackswap.apply(m, plan, workload=workload, backend=backend,
                                          **({"hardware": hardware} if backend == "checkpoint" else {}))
            except CheckpointBackendError as exc:
                print(f"{label}: not run: {exc}")
                continue
            step_time, peak, losses = run_steps(m, runtime)
            diff = max(abs(a - b) for a, b in zip(ideal_losses, losses))
            s = runtime.stats
            exact = emap.aligned if backend == "replay" else runtime.checkpoint_map.faithful
            sim_time, sim_peak = sim.step_time_s, sim.peak_memory_bytes
            if backend == "checkpoint":
                # Checkpoint rebuilds each region at its first unpack: simulate that schedule.
                cmap = runtime.checkpoint_map
                sim_time = simulate(workload, hardware, cmap.simulated_plan, budget_bytes=2**62,
                                    check=False).step_time_s
                sim_peak = cmap.predicted_peak_bytes
            rows.append((label, step_time, sim_time, peak, sim_peak, s.step_d2h_bytes,
                         s.peak_device_saved_bytes, s.late_prefetches, diff,
                         f"keep/swap/recompute {counts}; " + ("exact" if exact else "; ".join(emap.notes))))
            del m, runtime
            torch.cuda.empty_cache()

    print()
    print(f"{'config':26} {'step meas.':>11} {'step sim.':>11} {'peak meas.':>12} {'peak sim.':>12} "
          f"{'d2h/step':>11} {'mgr peak':>11} {'late':>5} {'max dloss':>9}")
    for name, t, ts, p, ps, d2h, mp, late, diff, note in rows:
        print(f"{name:26} {format_seconds(t):>11} {format_seconds(ts):>11} {format_bytes(p):>12} "
              f"{format_bytes(ps):>12} "
              f"{format_bytes(d2h):>11} {format_bytes(mp):>11} {late:>5} {diff:>9.2e}")
        if note:
            print(f"{'':26} {note}")
    print(f"\npeak meas. = torch.cuda.max_memory_allocated during the step minus memory allocated before it; "
          f"peak sim. counts saved activations only. Total wall time {time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
