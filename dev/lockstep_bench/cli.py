"""``lockstep bench ...``: the benchmark commands. Each writes a Markdown table and a JSON file to ``--out``;
their modules are imported inside the commands, so the parser loads no torch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lockstep import config as config_lib
from lockstep.sync import NAMES, REFERENCE_DESIGNS
from lockstep_bench.suites import SUITES
from lockstep_bench.sync_learning import CHOICES as LEARNING_CONFIGS
from lockstep_bench.sync_learning import WORKLOADS as LEARNING_WORKLOADS
from lockstep_bench.throughput import CONFIGS as THROUGHPUT_CONFIGS


def cmd_bench_sync(args: argparse.Namespace) -> int:
    if args.learning:
        return cmd_bench_sync_learning(args)
    from lockstep_bench import sync as bench_sync

    workload = (bench_sync.Workload.quick(args.adversarial) if args.quick
                else bench_sync.Workload(adversarial=args.adversarial))
    for field_name in ("env", "actors", "envs_per_actor", "steps_per_env", "iterations", "seed", "time_limit_s"):
        value = getattr(args, field_name)
        if value is not None:
            setattr(workload, field_name, value)
    if args.adversarial and args.actors is None:
        workload.actors = max(workload.actors, 2 * workload.inference_threads + 2)
    out = Path(args.out)
    bench_sync.run(workload, out, args.strategies)
    print((out / "sync.md").read_text())
    print(f"wrote {out / 'sync.md'} and {out / 'sync.json'}")
    return 0


def cmd_bench_sync_learning(args: argparse.Namespace) -> int:
    from lockstep_bench import sync_learning

    if args.seeds is not None and args.seeds < 1:
        raise config_lib.ConfigError(f"--seeds must be at least 1, got {args.seeds}")
    options = sync_learning.LearningOptions(scale=0.05 if args.quick else 1.0)
    options.workloads = args.workloads or options.workloads
    options.configs = args.configs or options.configs
    options.seeds = list(range(1, (args.seeds or len(options.seeds)) + 1))
    out = Path(args.out)
    if args.rebuild:  # the table and curves again, from the runs already in --out
        sync_learning.rebuild(out)
        print((out / "learning.md").read_text())
        return 0
    parts = ["lockstep bench sync --learning", f"--out {out}", f"--seeds {len(options.seeds)}"]
    parts += ["--workloads " + " ".join(args.workloads)] if args.workloads else []
    parts += ["--configs " + " ".join(args.configs)] if args.configs else []
    parts += ["--quick"] if args.quick else []
    report = sync_learning.run(options, out, " ".join(parts))
    print((out / "learning.md").read_text())
    print(f"wrote {out / 'learning.md'} and {out / 'learning.json'}")
    return 1 if any(r["error"] for r in report["runs"]) else 0


def cmd_bench_throughput(args: argparse.Namespace) -> int:
    from lockstep_bench import throughput

    out = Path(args.out)
    rows = throughput.run(out, quick=args.quick, device=args.device, configs=args.configs,
                          transports=tuple(args.transports), roundtrip_messages=args.roundtrip_messages,
                          repeats=args.repeats)
    print((out / "throughput.md").read_text())
    print(f"wrote {out / 'throughput.md'} and {out / 'throughput.json'}")
    return 0 if all(row["error"] is None for row in rows) else 1


def cmd_bench_learn(args: argparse.Namespace) -> int:
    if args.suite:
        return _bench_learn_suite(args)
    if args.budget_scale != 1.0:
        raise config_lib.ConfigError("--budget-scale scales the presets of a --suite; without one, give "
                                     "--set ppo.total_steps=N")
    from lockstep_bench import learn

    seeds = args.seeds or 5
    out = Path(args.out or "bench-results/learn")
    options = learn.LearnOptions(source=args.config or args.preset or config_lib.DEFAULT_PRESET,
                                 seeds=list(range(1, seeds + 1)), overrides=args.set,
                                 transport=args.transport, time_limit_s=args.time_limit_s)
    parts = ["lockstep bench learn", f"--config {args.config}" if args.config else f"--preset {options.source}",
             f"--seeds {seeds}", f"--out {out}"]
    parts += [f"--transport {options.transport}"] if options.transport else []
    parts += [f"--set {item}" for item in args.set]
    parts += [f"--time-limit-s {args.time_limit_s:g}"] if args.time_limit_s else []
    report = learn.run(options, out, " ".join(parts))
    print((out / "learn.md").read_text())
    print(f"wrote {out / 'learn.md'} and {out / 'learn.json'}")
    return 1 if any(r["error"] for r in report["runs"]) else 0


def _bench_learn_suite(args: argparse.Namespace) -> int:
    from lockstep.observe import plot
    from lockstep_bench import suites

    seeds = args.seeds or suites.DEFAULT_SEEDS
    options = suites.SuiteOptions(suite=args.suite, seeds=list(range(1, seeds + 1)), budget_scale=args.budget_scale,
                                  overrides=args.set, transport=args.transport, time_limit_s=args.time_limit_s)
    out = Path(args.out) if args.out else Path("bench-results") / f"learn-{args.suite.replace(',', '+')}"
    parts = ["lockstep bench learn", f"--suite {args.suite}", f"--seeds {seeds}", f"--out {out}"]
    parts += [f"--budget-scale {args.budget_scale:g}"] if args.budget_scale != 1.0 else []
    parts += [f"--transport {options.transport}"] if options.transport else []
    parts += [f"--set {item}" for item in args.set]
    parts += [f"--time-limit-s {args.time_limit_s:g}"] if args.time_limit_s else []
    try:
        report = suites.run(options, out, " ".join(parts))
    except plot.PlotUnavailable as err:
        print(f"lockstep: {err}", file=sys.stderr)
        return 2
    print((out / "results.md").read_text())
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and a PNG per env")
    return 1 if suites.failed(report) else 0


def cmd_bench_soak(args: argparse.Namespace) -> int:
    from lockstep_bench import soak

    report = soak.run(soak.SoakOptions(minutes=args.minutes, kill_every_s=args.kill_every, seed=args.seed,
                                       rogue=args.rogue), Path(args.out))
    width = max(map(len, report))
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    print(f"wrote {Path(args.out) / 'soak.json'}")
    return 0 if soak.healthy(report) else 1


def cmd_bench_repro(args: argparse.Namespace) -> int:
    from lockstep_bench import repro

    out = Path(args.out)
    report = repro.run(repro.ReproOptions(config=args.config, seed=args.seed, iterations=args.iterations,
                                          burners=args.burners), out)
    print((out / "repro.md").read_text())
    print(f"wrote {out / 'repro.md'} and {out / 'repro.json'}")
    return 0 if report["identical"] else 1


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def cmd_bench_scale(args: argparse.Namespace) -> int:
    from lockstep_bench import scale

    opts = scale.ScaleOptions.quick() if args.quick else scale.ScaleOptions()
    for name in ("sizes", "envs", "seconds", "phases", "steps_per_env", "actors_per_process"):
        if getattr(args, name) is not None:
            setattr(opts, name, getattr(args, name))
    out = Path(args.out)
    parts = ["lockstep bench scale", f"--out {out}", f"--sizes {','.join(map(str, opts.sizes))}",
             f"--envs {','.join(map(str, opts.envs))}", f"--seconds {opts.seconds:g}"]
    parts += [f"--phases {opts.phases}"] if opts.phases else []
    parts += [f"--steps-per-env {opts.steps_per_env}", f"--actors-per-process {opts.actors_per_process}"]
    rows = scale.run(opts, out, " ".join(parts))
    print((out / "scale.md").read_text())
    print(f"wrote {out / 'scale.md'} and {out / 'scale.json'}")
    return 0 if not any(row["errors"] for row in rows) else 1


def cmd_bench_peers(args: argparse.Namespace) -> int:
    from lockstep_bench import peers

    for flag, value, least in (("--seeds", args.seeds, 1), ("--steps", args.steps, 1), ("--peer-threads",
                                                                                     args.peer_threads, 0)):
        if value is not None and value < least:
            raise config_lib.ConfigError(f"{flag} must be at least {least}, got {value}")
    out = Path(args.out)
    seeds = list(range(1, args.seeds + 1))
    options = peers.PeersOptions(workloads=[args.only] if args.only else list(peers.DEFAULT_WORKLOADS),
                                 seeds=seeds, steps=args.steps, quick=args.quick,
                                 cache=Path(args.cache) if args.cache else None, python=args.python,
                                 scripts=Path(args.scripts) if args.scripts else None, sf_python=args.sf_python,
                                 peer_threads=args.peer_threads)
    parts = ["lockstep bench peers", f"--out {out}", f"--seeds {args.seeds}"]
    parts += [f"--only {args.only}"] if args.only else []
    parts += [f"--steps {args.steps}"] if args.steps else []
    parts += ["--quick"] if args.quick else []
    parts += [f"--peer-threads {args.peer_threads}"] if args.peer_threads != 1 else []
    parts += [f"--sf-python {args.sf_python}"] if args.sf_python else []
    report = peers.run(options, out, " ".join(parts))
    print((out / "peers.md").read_text())
    print(f"wrote {out / 'peers.md'} and {out / 'peers.json'}")
    return 1 if any(r["error"] for r in report["runs"]) else 0


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    from lockstep_bench import gpu

    out = Path(args.out)
    report = gpu.run(gpu.GpuOptions(device=args.device, quick=args.quick), out)
    print((out / "gpu.md").read_text())
    print(f"wrote {out / 'gpu.md'} and {out / 'gpu.json'}")
    return 0 if report["ok"] else 1


def cmd_bench_spaces(args: argparse.Namespace) -> int:
    from lockstep_bench import spaces

    out = Path(args.out)
    report = spaces.run(args.examples, out, seed=args.seed, multi_agent_share=args.multi_agent_share,
                        timeout_s=args.timeout_s)
    print((out / "spaces.md").read_text())
    print(f"wrote {out / 'spaces.md'} and {out / 'spaces.json'}")
    return 1 if report["failed"] else 0


def cmd_bench_fuzz(args: argparse.Namespace) -> int:
    from lockstep_bench import fuzz

    out = Path(args.out)
    report = fuzz.run(args.examples, out, seed=args.seed, targets=args.targets or None,
                      rss_bound_mb=args.rss_bound_mb, audit_batches=args.audit_batches)
    print((out / "fuzz.md").read_text())
    print(f"wrote {out / 'fuzz.md'} and {out / 'fuzz.json'}")
    return 1 if report["findings"] else 0


def cmd_bench_configs(args: argparse.Namespace) -> int:
    from lockstep_bench import configs

    out = Path(args.out)
    report = configs.run(args.examples, out, seed=args.seed, timeout_s=args.timeout_s, sweeps=args.sweeps)
    print((out / "configs.md").read_text())
    print(f"wrote {out / 'configs.md'} and {out / 'configs.json'}")
    return 1 if report["defects"] or report["sweeps"]["defects"] else 0


def cmd_bench_vector(args: argparse.Namespace) -> int:
    from lockstep_bench import vector

    out = Path(args.out)
    rows = vector.run(out, envs=args.envs, step_ms=args.step_ms, phases=args.phases)
    (out / "vector.md").write_text("\n".join(vector.markdown(rows, args.envs, args.step_ms, args.phases)) + "\n")
    print((out / "vector.md").read_text())
    print(f"wrote {out / 'vector.md'} and {out / 'vector.json'}")
    return 1 if any(r["error"] for r in rows) else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``bench`` command and its subcommands, under the main parser's ``sub``."""
    bench = sub.add_parser("bench", help="benchmarks; each writes a table and JSON to --out")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    p = bench_sub.add_parser("sync", help="the same workload once per synchronization strategy")
    p.add_argument("--out", default="bench-results", help="folder for sync.md and sync.json")
    p.add_argument("--quick", action="store_true", help="a small workload, under two minutes")
    p.add_argument("--adversarial", action="store_true",
                   help="random delays in inference, training and guards; more actors than inference threads")
    p.add_argument("--strategies", nargs="+", choices=[*NAMES, *REFERENCE_DESIGNS],
                   help="subset to run (default: all)")
    p.add_argument("--env")
    p.add_argument("--actors", type=int)
    p.add_argument("--envs-per-actor", type=int)
    p.add_argument("--steps-per-env", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--time-limit-s", type=float, help="per strategy")
    p.add_argument("--learning", action="store_true",
                   help="learning, not mechanics: strict, pipelined and async (lag 2 and 8, with and without V-trace) "
                        "on several workloads and seeds, returns at equal steps and seconds (hours; docs/"
                        "synchronization.md)")
    p.add_argument("--workloads", nargs="+", choices=list(LEARNING_WORKLOADS), help="with --learning: a subset")
    p.add_argument("--configs", nargs="+", choices=list(LEARNING_CONFIGS), help="with --learning: a subset")
    p.add_argument("--seeds", type=int, help="with --learning: seeds 1..N (default 3)")
    p.add_argument("--rebuild", action="store_true",
                   help="with --learning: write the table and curves again from the runs already in --out")
    p.set_defaults(func=cmd_bench_sync)

    p = bench_sub.add_parser("throughput", help="env steps/s of the distributed modes against an in-process baseline")
    p.add_argument("--out", default="bench-results/throughput",
                   help="folder for throughput.md, throughput.json, configs/ and runs/")
    p.add_argument("--quick", action="store_true", help="small step budgets, about four minutes on 2 cores")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="learner and baseline device")
    p.add_argument("--configs", nargs="+", choices=list(THROUGHPUT_CONFIGS), help="subset to run (default: all)")
    p.add_argument("--transports", nargs="+", choices=["inprocess", "shm", "grpc"],
                   default=["inprocess", "shm", "grpc"],
                   help="the transports each distributed mode runs over, side by side (default: all three)")
    p.add_argument("--roundtrip-messages", type=int,
                   help="messages per transport in the round-trip micro-benchmark (default 20,480 with --quick, "
                        "else 102,400; 0 skips it)")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="run each config's baseline and modes N times, round after round, and add a table of the "
                        "median ratios (default 1)")
    p.set_defaults(func=cmd_bench_throughput)

    p = bench_sub.add_parser("learn", help="seconds and env steps to a return threshold, per seed: lockstep train "
                                           "against the in-process baseline, interleaved; or, with --suite, the "
                                           "final return of a suite of presets at their budgets")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--preset", choices=config_lib.preset_names(),
                       help=f"preset to run (default {config_lib.DEFAULT_PRESET})")
    which.add_argument("--config", metavar="FILE_OR_PRESET", help="a YAML config file (or a preset name) to run")
    which.add_argument("--suite", metavar="NAME",
                       help="train each preset of a suite for its whole budget, once per seed, and compare the "
                            "final return with CleanRL's published figures: "
                            + "; ".join(f"{name} ({', '.join(presets)})" for name, presets in SUITES.items())
                            + "; or a comma-separated list of presets and YAML files. Writes results.md, "
                              "results.json and a PNG of learning curves per env")
    p.add_argument("--seeds", type=int, help="run seeds 1 to N (default 5; with --suite, 3 as CleanRL's tables)")
    p.add_argument("--out", help="folder for the results (default bench-results/learn; with --suite, "
                                 "bench-results/learn-SUITE)")
    p.add_argument("--budget-scale", type=float, default=1.0,
                   help="--suite: multiply each preset's ppo.total_steps by this (e.g. 0.01 for a quick look)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field in every run, e.g. --set ppo.total_steps=200000 (repeatable)")
    p.add_argument("--time-limit-s", type=float,
                   help="cap on each run's training time; without --suite, where the config sets no "
                        "run.time_limit_s (default 120); with --suite, for every run (default: none)")
    p.add_argument("--transport", choices=config_lib.setting_of("actors.transport").choices,
                   help="actors.transport of the distributed runs (default: the config's)")
    p.set_defaults(func=cmd_bench_learn)

    p = bench_sub.add_parser("soak", help="train while killing actors and once the learner; check the books")
    p.add_argument("--minutes", type=float, default=3.0, help="training time, across the learner restart")
    p.add_argument("--kill-every", type=float, default=12.0, help="mean seconds between actor kills")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rogue", type=int, default=0, metavar="N",
                   help="N hostile clients beside the fleet: silent members, absurd hellos, id stealers without "
                        "the token, idle connections")
    p.add_argument("--out", default="bench-results/soak", help="folder for soak.json, soak.log and the run")
    p.set_defaults(func=cmd_bench_soak)

    p = bench_sub.add_parser("repro", help="the same strict run twice, once beside CPU burners; identical metrics?")
    p.add_argument("--config", help="YAML config file (default: the built-in CartPole defaults)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--iterations", type=int, default=30, help="iterations of each run")
    p.add_argument("--burners", type=int, default=1, help="CPU-burning processes beside the second run")
    p.add_argument("--out", default="bench-results/repro", help="folder for repro.md, repro.json and the runs")
    p.set_defaults(func=cmd_bench_repro)

    p = bench_sub.add_parser("scale", help="one learner against 10 to 1,000 simulated gRPC actors: messages/s, "
                                           "learner CPU per message, publish-to-release latency, memory per actor")
    p.add_argument("--out", default="bench-results/scale", help="folder for scale.md, scale.json and runs/")
    p.add_argument("--sizes", type=_int_list, help="actor counts (default 10,100,1000)")
    p.add_argument("--envs", type=_int_list, help="envs per actor; every size runs with each (default 1,8)")
    p.add_argument("--seconds", type=float, help="training seconds per size (default 20; 8 with --quick)")
    p.add_argument("--phases", type=int, help="stop a size after this many phases, if sooner than --seconds")
    p.add_argument("--steps-per-env", type=int, help="T (default 8)")
    p.add_argument("--actors-per-process", type=int, help="simulated actors per client process (default 250)")
    p.add_argument("--quick", action="store_true", help="8 s per size")
    p.set_defaults(func=cmd_bench_scale)

    p = bench_sub.add_parser("peers", help="CleanRL's ppo.py and ppo_continuous_action.py, or Sample Factory's Doom "
                                           "and Atari examples, against the matching lockstep presets, "
                                           "interleaved: env steps/s, seconds to a return, final returns")
    p.add_argument("--out", default="bench-results/peers", help="folder for peers.md, peers.json and runs/")
    p.add_argument("--only", choices=["cartpole", "hopper", "halfcheetah", "doom", "breakout-sf"],
                   help="one workload (default: the CleanRL ones, cartpole, hopper and halfcheetah; doom and "
                        "breakout-sf run Sample Factory 2.1.1 against doom-basic and breakout)")
    p.add_argument("--steps", type=int, help="env (agent) steps of every run (default 100,000 CartPole, 40,960 "
                                             "Hopper, 200,000 Doom, 100,000 Breakout; 8,192 and 4,096 with --quick)")
    p.add_argument("--seeds", type=int, default=1, help="run seeds 1 to N")
    p.add_argument("--quick", action="store_true", help="small step budgets")
    p.add_argument("--cache", help="folder for CleanRL's throwaway virtual environment and scripts, kept between "
                                   "invocations (default OUT/cleanrl); Sample Factory's is its samplefactory/ "
                                   "(default OUT/samplefactory)")
    p.add_argument("--python", help="a ready interpreter with CleanRL's dependencies, instead of the venv")
    p.add_argument("--scripts", help="a folder holding ppo.py and ppo_continuous_action.py (e.g. a CleanRL "
                                     "checkout), instead of the wheel's")
    p.add_argument("--sf-python", help="a ready interpreter with sample-factory 2.1.1 and its examples' envs, "
                                       "instead of its venv")
    p.add_argument("--peer-threads", type=int, default=1,
                   help="OMP_NUM_THREADS of the peer's runs (default 1, as lockstep's learner.torch_threads; 0: "
                        "torch's default, one per core, which spins against itself on a busy machine)")
    p.set_defaults(func=cmd_bench_peers)

    p = bench_sub.add_parser("gpu", help="inference latency against batch size, Breakout and Hopper with the time "
                                         "split, an audited strict run, peak memory; on a GPU or the CPU")
    p.add_argument("--out", default="bench-results/gpu", help="folder for gpu.md, gpu.json and runs/")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="small sizes (the CPU check of the suite)")
    p.set_defaults(func=cmd_bench_gpu)

    p = bench_sub.add_parser("spaces", help="generated observation and action spaces (masks, normalization, both "
                                            "inference kernels, PettingZoo slots): each trained, audited, evaluated")
    p.add_argument("--examples", type=int, default=200, help="examples to draw and run")
    p.add_argument("--out", default="bench-results/spaces", help="folder for spaces.md and spaces.json")
    p.add_argument("--seed", type=int, default=0, help="the draws' seed (the same seed draws the same examples)")
    p.add_argument("--multi-agent-share", type=float, default=0.25,
                   help="the share of examples that are PettingZoo slots whose agents leave early")
    p.add_argument("--timeout-s", type=float, default=120.0, help="an example still running then has failed")
    p.set_defaults(func=cmd_bench_spaces)

    p = bench_sub.add_parser("fuzz", help="generated clients (hellos, steps, orders, disconnects) over gRPC and shared "
                                          "memory against real learners beside an honest actor: none may end the run")
    p.add_argument("--examples", type=int, default=200, help="client sessions per learner config")
    p.add_argument("--out", default="bench-results/fuzz", help="folder for fuzz.md, fuzz.json and runs/")
    p.add_argument("--seed", type=int, default=0, help="the draws' seed (the same seed draws the same sessions)")
    p.add_argument("--target", dest="targets", action="append", choices=["frozenlake", "mask-lstm", "teams", "critic"],
                   help="a learner config to fuzz (repeatable; default every one)")
    p.add_argument("--rss-bound-mb", type=float, default=100.0,
                   help="how much the learner's memory may grow from the first quarter of the examples to the end")
    p.add_argument("--audit-batches", type=int, default=None,
                   help="audit this many of each run's batches, spread over it (default: every one; an LSTM's "
                        "audit replays each step)")
    p.set_defaults(func=cmd_bench_fuzz)

    p = bench_sub.add_parser("configs", help="generated configs (every section's fields inside, on and outside "
                                             "their ranges, policies, transports, sync strategies, LSTM, "
                                             "evaluation): each refused at start by name, or trained, resumed, "
                                             "evaluated and audited")
    p.add_argument("--examples", type=int, default=200, help="examples to draw and run")
    p.add_argument("--out", default="bench-results/configs", help="folder for configs.md and configs.json")
    p.add_argument("--seed", type=int, default=0, help="the draws' seed (the same seed draws the same examples)")
    p.add_argument("--timeout-s", type=float, default=90.0, help="an example still running then is a defect")
    p.add_argument("--sweeps", type=int, default=2, help="the first N examples that pass are also swept "
                                                         "(lockstep sweep, two trials, two at once)")
    p.set_defaults(func=cmd_bench_configs)

    p = bench_sub.add_parser("vector", help="env steps/s of envs that take milliseconds a step: 1 actor x N envs "
                                            "sync, 1 x N async (actors.vector), N actors x 1 env")
    p.add_argument("--out", default="bench-results/vector", help="folder for vector.md, vector.json and runs/")
    p.add_argument("--envs", type=int, default=8, help="N: the envs of each layout")
    p.add_argument("--step-ms", type=float, default=2.0, help="the milliseconds each env step takes")
    p.add_argument("--phases", type=int, default=12, help="phases of 32 steps per env each run collects")
    p.set_defaults(func=cmd_bench_vector)
