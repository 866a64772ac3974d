"""Measured on a GPU: the host link, and real training steps against the simulator's predictions.

    python benchmarks/gpu_validate.py --out DIR       # one GPU, under 7 minutes (docs/gpu-validation.md)
    python benchmarks/gpu_validate.py --dry-run       # the same logic on CPU, tiny model, seconds

Writes DIR/gpu-<device>.md, DIR/gpu-<device>.json and DIR/<device>-measured.json (a hardware
file the CLI accepts), rewritten after every section so a run cut short keeps what it measured:
1. the link: pinned H2D and D2H per copy for 64 KiB-256 MiB, both directions at once (duplex
   factors), per-copy latency; bf16 GEMMs of the model's shapes, causal SDPA and a device copy
   (efficiencies against the datasheet peak); all of it as the measured Hardware;
2. a GPT-2-medium-sized model (24 layers, hidden 1024, sequence 1024, bf16, micro-batch sized to
   the GPU) profiled on the GPU, planned at budgets 0.3/0.5/0.8 with slackswap, capuchin,
   swap-only and full-recompute on the measured hardware, each plan run for the timed steps
   under the runtime (and under slackswap.compile where this slackswap has it): step time,
   memory, bytes copied, late prefetches, host time and gradients against the simulation and
   plain training;
3. plain training, torch.utils.checkpoint per block and save_on_cpu in the same run.
Every measurement goes through gpu_validation.device, so --dry-run runs all of it on CPU.
Without CUDA (and without --dry-run): one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

# cuBLAS needs this before CUDA starts to run deterministically (the gradient check turns
# torch.use_deterministic_algorithms on for one step per configuration).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

POLICIES = ("slackswap", "capuchin", "swap-only", "full-recompute")
BUDGETS = (0.3, 0.5, 0.8)
# HF gpt2-medium: L24 h1024 a16 f4096 V50257, n_ctx 1024.
GPT2_MEDIUM = dict(vocab=50257, seq_len=1024, hidden=1024, heads=16, layers=24, ffn=4096, dropout=0.1)
TINY = dict(vocab=64, seq_len=16, hidden=32, heads=4, layers=2, ffn=64, dropout=0.1)
MAX_MICRO_BATCH = 8  # bounds the step (and the pinned host memory of save_on_cpu) to fit the time limit
COMPILE_ALLOWANCE_S = 60.0  # time allowed for the first torch.compile of the model (a guess; then the slowest seen)
MEMORY_SHARE = 0.25  # plain training's step peak may use this share of the device memory


@dataclasses.dataclass(frozen=True)
class Settings:
    """What differs between the GPU run and the dry run."""
    model: dict
    micro_batch: int | None  # None: sized to the device
    warmup: int
    steps: int
    link_sizes_bytes: tuple[int, ...]
    link_repeats: int
    compute_iters: int
    hbm_size_bytes: int
    profile_repeats: int
    compiled_only: tuple[float, str] | None  # (budget, policy) the dry run compiles; None: every configuration


def settings_for(args) -> Settings:
    from gpu_validation.link import DRY_SIZES_BYTES, FULL_SIZES_BYTES

    if args.dry_run:
        return Settings(TINY, args.micro_batch or 2, warmup=0, steps=args.steps or 1,
                        link_sizes_bytes=DRY_SIZES_BYTES, link_repeats=3, compute_iters=2,
                        hbm_size_bytes=4 * 2**20, profile_repeats=1, compiled_only=(0.5, "slackswap"))
    return Settings(GPT2_MEDIUM, args.micro_batch, warmup=2, steps=args.steps or 10,
                    link_sizes_bytes=FULL_SIZES_BYTES, link_repeats=5, compute_iters=10,
                    hbm_size_bytes=2**30, profile_repeats=3, compiled_only=None)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default benchmarks/results; a new temporary folder with --dry-run)")
    p.add_argument("--dry-run", action="store_true", help="tiny model, few steps, on CPU unless --device cuda")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default cuda (cpu with --dry-run); cpu always means the dry run")
    p.add_argument("--micro-batch", type=int, default=None, help="default: sized to the GPU (2 in a dry run)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per configuration (default 10; 1 in a dry run)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    p.add_argument("--time-limit-s", type=float, default=360.0,
                   help="a configuration that would end past this many seconds after the start is skipped, "
                        "with a note (default 360 s: the run then ends within about 7 minutes)")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend of the compiled path (default inductor; aot_eager in a dry run)")
    args = p.parse_args(argv)
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    args.dry_run = args.dry_run or args.device == "cpu"  # the full model on CPU would take hours
    # inductor on CPU needs a C++ toolchain and compiles far slower; aot_eager runs the same planning
    args.compile_backend = args.compile_backend or ("aot_eager" if args.dry_run else "inductor")
    args.policies = tuple(x for x in args.policies.split(",") if x)
    try:
        args.budgets = tuple(float(x) for x in args.budgets.split(",") if x)
    except ValueError:
        p.error(f"--budgets must be fractions separated by commas, got {args.budgets!r}")
    if any(not 0 < x <= 1 for x in args.budgets) or (args.micro_batch is not None and args.micro_batch < 1):
        p.error("--budgets must be fractions in (0, 1] and --micro-batch at least 1")
    return args


class Run:
    """The results being built, written to disk after each section."""

    def __init__(self, args, argv: list[str], device, out_dir: Path) -> None:
        from gpu_validation.report import RESULTS_FORMAT

        self.started = time.perf_counter()
        self.deadline = self.started + args.time_limit_s
        self.time_limit_s = args.time_limit_s
        self.out_dir = out_dir
        self.results = {
            "format": RESULTS_FORMAT, "dry_run": bool(args.dry_run), "argv": list(argv),
            "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": device.describe(), "config": {}, "rows": [], "notes": [],
        }

    def save(self) -> None:
        from gpu_validation.report import ratios, summarize, write_results

        for row in self.results["rows"]:
            row["ratios"] = ratios(row.get("measured"), row.get("predicted"))
        self.results["summary"] = summarize(self.results["rows"])
        self.results["wall_time_s"] = time.perf_counter() - self.started
        write_results(self.results, self.out_dir)

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    def add_row(self, row: dict) -> dict:
        row.setdefault("note", "")
        row["ratios"] = {}
        self.results["rows"].append(row)
        return row


def log(text: str) -> None:
    print(text, flush=True)


def failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


def timed_workload(workload, hardware):
    """``workload`` with the times slackswap plans with on ``hardware`` (profiler.build.timed_for,
    where this slackswap has it)."""
    try:
        from slackswap.profiler.build import timed_for
    except ImportError:
        return workload
    return timed_for(workload, hardware)


def by_priority(budgets, policies) -> list[tuple[float, str]]:
    """Every (budget, policy), budgets nearest 0.5 first (the middle of the range is the one to keep
    when the time limit cuts the run short), policies in the order given."""
    return sorted(((b, p) for b in budgets for p in policies), key=lambda bp: abs(bp[0] - 0.5))


def compiled_rows(run: Run, args, cfg: Settings, timed, make) -> None:
    """The plans under slackswap.compile (each compiles the model again, so the time limit may leave
    only the first ones); ``make(budget, policy)`` compiles and returns (Method, prediction)."""
    from slackswap.units import format_seconds

    allowance_s = COMPILE_ALLOWANCE_S  # grows to the slowest compile seen
    for budget, policy in by_priority(args.budgets, args.policies):
        row = run.add_row({"name": f"{policy} @ {budget:g} (compiled)", "group": "plan", "method": "compiled",
                           "status": "pending", "policy": policy, "budget_fraction": budget})
        if cfg.compiled_only is not None and (budget, policy) != cfg.compiled_only:
            b, p = cfg.compiled_only  # each compile costs seconds of CPU: one checks the path
            row.update(status="skipped", note=f"the dry run compiles {p} @ {b:g} only")
        else:
            def method(budget=budget, policy=policy, row=row):
                start = time.perf_counter()
                compiled, predicted = make(budget, policy)
                row.update(predicted=predicted, planning_time_s=time.perf_counter() - start)
                return compiled
            timed(row, method, allowance_s)
            allowance_s = max(allowance_s, row.get("planning_time_s", 0.0))
        m = row.get("measured") or {}
        log(f"{row['name']}: {row['status']}{' (' + row['note'] + ')' if row['note'] else ''}"
            + (f", step {format_seconds(m['step_time_s'])}" if m else ""))
        run.save()


def micro_batch_for(step_peak_per_sequence_bytes: int, free_bytes: int) -> int:
    """Largest power of two up to MAX_MICRO_BATCH whose plain step peak fits MEMORY_SHARE of the
    free device memory (at least 1)."""
    mb = 1
    while mb * 2 <= MAX_MICRO_BATCH and 2 * mb * step_peak_per_sequence_bytes <= MEMORY_SHARE * free_bytes:
        mb *= 2
    return mb


def size_micro_batch(trainer, device, make_method) -> tuple[int, str]:
    """micro_batch_for the plain step peak measured at micro-batch 1."""
    one = trainer.measure(make_method(1), warmup=1, steps=1).to_dict()["step_peak_bytes"]
    mb = micro_batch_for(one, device.total_memory_bytes() - device.allocated_bytes())
    return mb, (f"largest power of two up to {MAX_MICRO_BATCH} whose plain step peak, {one:,} bytes per "
                f"sequence measured, fits {MEMORY_SHARE:.0%} of the device memory")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_validate: error: needs torch: pip install 'slackswap[torch]'", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_validation.device import open_device

    try:
        device = open_device(args.device)
    except RuntimeError as exc:
        print(f"gpu_validate: error: {exc}; nothing was run", file=sys.stderr)
        return 2
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="gpu-validate-")) if args.dry_run
                           else Path(__file__).resolve().parent / "results")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"gpu_validate: error: cannot create results folder {out_dir}: {exc.strerror}", file=sys.stderr)
        return 2
    run = Run(args, argv, device, out_dir)
    try:
        validate(run, args, settings_for(args), device, torch)
    except Exception as exc:  # keep what was measured: the files say where the run stopped
        run.results["notes"].append(f"the run stopped early: {failure(exc)}")
        run.results["traceback"] = traceback.format_exc()
        run.save()
        traceback.print_exc()
        print(f"gpu_validate: error: the run stopped early ({failure(exc)}); partial results in {out_dir}",
              file=sys.stderr)
        return 1
    run.save()
    log(f"wrote {out_dir}/gpu-{device.slug}.md, gpu-{device.slug}.json and {device.slug}-measured.json "
        f"in {time.perf_counter() - run.started:.0f} s")
    return 0


def validate(run: Run, args, cfg: Settings, device, torch) -> None:
    import slackswap
    from gpu_validation.compiled import Unavailable, compiled_method
    from gpu_validation.compute import measure_compute, measured_hardware
    from gpu_validation.link import measure_link
    from gpu_validation.prediction import ideal_plan, predict
    from gpu_validation.report import results_paths
    from gpu_validation.training import Method, Trainer, peer_methods, runtime_method
    from slackswap.examples import ExampleConfig, loss_fn, make_batch, make_example
    from slackswap.hardware import Hardware
    from slackswap.profiler import profile_model
    from slackswap.sim import simulate_ideal
    from slackswap.units import format_bytes, format_seconds

    r = run.results
    r["config"] = {"policies": list(args.policies), "budgets": list(args.budgets), "warmup": cfg.warmup,
                   "steps": cfg.steps, "time_limit_s": args.time_limit_s, "compile_backend": args.compile_backend}
    log(f"device: {device.name} ({device.kind}), torch {torch.__version__}; results in {run.out_dir}")

    # ---- 1. the link and the device ----------------------------------------------------------
    link = measure_link(device, cfg.link_sizes_bytes, cfg.link_repeats)
    r["link"] = link.to_dict()
    log(f"link: H2D {link.largest.h2d_bytes_per_s / 1e9:.2f} GB/s, D2H {link.largest.d2h_bytes_per_s / 1e9:.2f} GB/s "
        f"at {format_bytes(link.largest.size_bytes)}; duplex factors H2D {link.duplex.h2d_factor:.2f}x, "
        f"D2H {link.duplex.d2h_factor:.2f}x; latency {format_seconds(link.copy_latency_s)} per copy")

    dtype = torch.bfloat16
    config = ExampleConfig(**cfg.model, micro_batch=cfg.micro_batch or 1)
    model = make_example("gpt2", config, device=device.torch_device, dtype=dtype)
    trainer = Trainer(device, model)

    def plain(mb: int) -> Method:
        batch_mb = make_batch(dataclasses.replace(config, micro_batch=mb), device=device.torch_device)
        return Method("plain training", lambda: loss_fn(model, batch_mb))

    rule = "given on the command line" if args.micro_batch else "the dry run's"
    if cfg.micro_batch is None:
        mb, rule = size_micro_batch(trainer, device, plain)
        config = dataclasses.replace(config, micro_batch=mb)
    batch = make_batch(config, device=device.torch_device)
    r["model"] = {"kind": "gpt2", "config": dataclasses.asdict(config), "dtype": "bfloat16",
                  "micro_batch": config.micro_batch, "micro_batch_rule": rule,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "description": f"GPT-2-like from slackswap.examples, {config.layers} layers, hidden {config.hidden}, "
                                 f"{config.heads} heads, sequence {config.seq_len}, vocabulary {config.vocab}"}

    compute = measure_compute(device, config, dtype, hbm_size_bytes=cfg.hbm_size_bytes, iters=cfg.compute_iters,
                              repeats=3)
    r["compute"] = compute.to_dict()
    hw_path = results_paths(run.out_dir, device.slug)["hardware"]
    measured_hardware(device, link, compute, r["started_utc"]).save(hw_path)
    hardware = Hardware.load(hw_path)  # plan and simulate with exactly what the file says
    r["hardware"] = {"file": hw_path.name, **hardware.to_dict()}
    log(f"compute: GEMMs {compute.gemm_flops_per_s / 1e12:.1f} TFLOP/s ({compute.gemm_efficiency:.1%} of peak), "
        f"attention {compute.attention_efficiency:.1%}, HBM {compute.hbm_bytes_per_s / 1e9:.0f} GB/s; wrote {hw_path}")
    run.save()

    # ---- 2. plain training, the profile, the plans --------------------------------------------
    def loss():
        return loss_fn(model, batch)

    plain_row = run.add_row({"name": "plain training", "group": "reference", "method": "plain", "status": "ok"})
    plain_row["measured"] = trainer.measure(Method("plain", loss), warmup=cfg.warmup, steps=cfg.steps,
                                            is_reference=True).to_dict()
    step_s = plain_row["measured"]["step_time_s"]
    log(f"plain: micro-batch {config.micro_batch}, step {format_seconds(step_s)}, "
        f"step peak {format_bytes(plain_row['measured']['step_peak_bytes'] or 0)}")

    t0 = time.perf_counter()
    workload = profile_model(model, batch, loss_fn, warmup=1, repeats=cfg.profile_repeats)
    # The times slackswap.plan and simulate use on this hardware (the GPU's own profile as measured;
    # the dry run's CPU profile projected by the roofline); the runtime runs the profile itself.
    planned = timed_workload(workload, hardware)
    ideal = simulate_ideal(planned, hardware)
    r["profile"] = {"ops": len(workload.ops), "saved_tensors": len(workload.saved_tensors),
                    "saved_bytes": workload.saved_bytes, "profile_time_s": time.perf_counter() - t0,
                    "times": str(planned.meta.get("times", "measured")),
                    "simulated_ideal_step_time_s": ideal.step_time_s,
                    "simulated_ideal_peak_bytes": ideal.peak_memory_bytes}
    params = r["model"]["parameters"]
    plain_row["predicted"] = predict(planned, hardware, ideal_plan(planned), params)
    log(f"profile: {len(workload.ops)} ops in {format_seconds(r['profile']['profile_time_s'])}; simulated ideal "
        f"step {format_seconds(ideal.step_time_s)}, peak {format_bytes(ideal.peak_memory_bytes)}")
    run.save()

    def estimate_s() -> float:  # a configuration's steps at up to 4x plain's step time, plus setup
        return 4 * step_s * (cfg.warmup + cfg.steps + 1) + 5

    def timed(row: dict, make_method, setup_s: float = 0.0) -> None:
        if run.left_s() < estimate_s() + setup_s:
            row.update(status="skipped", note=f"time limit ({run.time_limit_s:.0f} s) reached")
            return
        try:
            method = make_method()
            row["measured"] = trainer.measure(method, warmup=cfg.warmup, steps=cfg.steps).to_dict()
            row["status"] = "ok"
        except Unavailable as exc:
            row.update(status="skipped", note=str(exc))
        except Exception as exc:
            row.update(status="failed", note=failure(exc))
        finally:
            device.release_cached()


    def runtime_rows() -> None:
        """Plan, predict and run each configuration in turn, budget 0.5 first, so the time limit
        (which counts the slowest planning so far) leaves out the least informative ones."""
        planning_allowance_s = 0.0
        for budget, policy in by_priority(args.budgets, args.policies):
            row = run.add_row({"name": f"{policy} @ {budget:g} (runtime)", "group": "plan", "method": "runtime",
                               "status": "pending", "policy": policy, "budget_fraction": budget})
            if run.left_s() < estimate_s() + planning_allowance_s:
                row.update(status="skipped", note=f"time limit ({run.time_limit_s:.0f} s) reached")
            else:
                t0 = time.perf_counter()
                try:
                    plan = slackswap.plan(workload, hardware, budget=budget, policy=policy)
                    row.update(predicted=predict(planned, hardware, plan, params), budget_bytes=plan.budget_bytes)
                except Exception as exc:  # one policy failing must not hide the others
                    plan = None
                    row.update(status="failed", note=f"planning: {failure(exc)}")
                row["planning_time_s"] = time.perf_counter() - t0
                planning_allowance_s = max(planning_allowance_s, row["planning_time_s"])
                if plan is not None:
                    timed(row, lambda: runtime_method(row["name"], slackswap.apply(model, plan, workload=workload),
                                                      loss))
            m = row.get("measured") or {}
            log(f"{row['name']}: {row['status']}{' (' + row['note'] + ')' if row['note'] else ''}"
                + (f", step {format_seconds(m['step_time_s'])} measured vs "
                   f"{format_seconds(row['predicted']['step_time_s'])} simulated" if m else ""))
            run.save()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runtime_rows()
        for method in peer_methods(device, model, loss):
            row = run.add_row({"name": method.name, "group": "peer", "method": method.name, "status": "pending"})
            timed(row, lambda: method)
            log(f"{row['name']}: {row['status']}" + (f", step {format_seconds(row['measured']['step_time_s'])}"
                                                      if row.get("measured") else ""))
            run.save()
        compiled_rows(run, args, cfg, timed, lambda budget, policy: compiled_method(
            f"{policy} @ {budget:g} (compiled)", model, batch, loss_fn, hardware=hardware, budget=budget,
            policy=policy, backend=args.compile_backend, parameter_count=params))
    r["notes"] += sorted({x["predicted"]["memory_note"] for x in r["rows"] if (x.get("predicted") or {}).get(
        "memory_note")})
    seen = sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught})
    r["notes"] += [f"warning during the steps: {w}" for w in seen[:20]]
    r["notes"] += [
        "step peak counts everything the step allocates beyond what was allocated before it (saved activations, "
        "gradients of activations in backward, transient tensors, workspaces); the simulated activation peak "
        "counts saved activations only, so its ratio is above 1 even for plain training.",
        "simulated figures use the profile's measured op times and the measured hardware file; planning time "
        "includes the simulation of the plan.",
    ]


if __name__ == "__main__":
    sys.exit(main())
