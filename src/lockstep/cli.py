"""The ``lockstep`` command line. Heavy modules (torch) are imported inside commands, so that
``lockstep actor`` and spawned actor processes never load torch."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from lockstep import config as config_lib
from lockstep.bench import cli as bench_cli
from lockstep.transport import security

# flag -> config field; each flag overrides the YAML file given by --config
TRAINING_FLAGS = [
    ("--env", "env.id", "Gymnasium id or package.module:callable"),
    ("--actors", "env.actors", "local actor processes (train) / expected actors (learner)"),
    ("--envs-per-actor", "env.envs_per_actor", "environments per actor"),
    ("--steps-per-env", "ppo.steps_per_env", "T: steps each env slot takes per policy version"),
    ("--total-steps", "ppo.total_steps", "env steps to train for"),
    ("--lr", "ppo.lr", "Adam learning rate"),
    ("--seed", "run.seed", "run seed"),
    ("--name", "run.name", "run name (default <env>-s<seed>-<time>)"),
    ("--run-dir", "run.run_dir", "run directory (default runs/<name>)"),
    ("--device", "learner.device", "auto, cpu or cuda"),
    ("--listen", "learner.listen", "host:port the learner listens on"),
    ("--transport", "learner.transport",
     "train: how the local actors reach the learner: shm (actor processes, shared memory; default), "
     "grpc (actor processes, loopback) or inprocess (env loops inside the learner process, for cheap envs)"),
    ("--min-actors", "learner.min_actors", "actors to wait for before the first phase (0: --actors)"),
    ("--stop-at-return", "run.stop_at_return", "stop once the running mean return reaches this"),
    ("--sync", "sync.strategy",
     "synchronization: strict (default), pipelined, spin-flags, spin-redo, reject-retry, seqlock"),
    ("--max-lag", "sync.max_lag", "pipelined: most versions a sample may lag the version that trains on it"),
    ("--phase-cutoff", "sync.phase_cutoff",
     "DD-PPO straggler cut-off: close a phase once this fraction of slots is full"),
    ("--min-unroll", "sync.min_unroll", "with --phase-cutoff: fraction of T every other slot must have"),
    ("--checkpoint-every", "run.checkpoint_every", "iterations between periodic checkpoints"),
    ("--checkpoint-minutes", "run.checkpoint_minutes", "minutes between periodic checkpoints"),
]


def _add_training_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE_OR_PRESET",
                   help="a YAML config file or a preset name (" + ", ".join(config_lib.preset_names())
                        + f"); flags override it. Default: train uses the {config_lib.DEFAULT_PRESET} preset for "
                        "CartPole-v1; other --env values and the learner command use the built-in defaults "
                        "(CleanRL's settings)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue RUN_DIR from its newest checkpoint (its config.yaml; flags override it)")
    for flag, dotted, help_text in TRAINING_FLAGS:
        p.add_argument(flag, dest=dotted, default=None, help=f"{help_text} [{dotted}]")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set ppo.ent_coef=0.0 (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    p.add_argument("--audit", action="store_true", help="write each training batch and policy to RUN_DIR/audit")
    p.add_argument("--token", help=f"shared secret actors must present (default ${security.TOKEN_ENV}); "
                                   "required to listen off loopback")
    p.add_argument("--tls-cert", dest="learner.tls_cert", help="PEM certificate chain: serve TLS [learner.tls_cert]")
    p.add_argument("--tls-key", dest="learner.tls_key", help="PEM private key for --tls-cert [learner.tls_key]")
    p.add_argument("--sanitize", action="store_true",
                   help="replace NaN/inf observations and rewards instead of refusing them [learner.sanitize]")


def resolve_config(args: argparse.Namespace) -> config_lib.Config:
    if args.resume:
        if args.config:
            raise config_lib.ConfigError("--resume uses RUN_DIR/config.yaml; give overrides as flags, not --config")
        config = config_lib.load(Path(args.resume) / "config.yaml")
        config.run.run_dir = args.resume
    elif args.config:
        config = config_lib.load(args.config)
    elif args.command == "train":
        config = config_lib.default_config(getattr(args, "env.id"))
    else:  # a lone learner: its actors start elsewhere, with env counts that no preset describes
        config = config_lib.Config()
    for dotted in [d for _, d, _ in TRAINING_FLAGS] + ["learner.tls_cert", "learner.tls_key"]:
        value = getattr(args, dotted)
        if value is not None:
            config_lib.set_value(config, dotted, value)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise config_lib.ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        config_lib.set_value(config, key.strip(), value.strip())
    if args.no_progress:
        config.run.progress = False
    if args.audit:
        config.run.audit = True
    if args.sanitize:
        config.learner.sanitize = True
    if not config.run.name:
        env_name = config.env.id.replace("/", "_").replace(":", "_")
        config.run.name = f"{env_name}-s{config.run.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not config.run.run_dir:
        config.run.run_dir = str(Path("runs") / config.run.name)
    config.validate()
    return config


def _print_summary(summary: dict, run_dir: Path) -> None:
    def crossing(v: dict | None) -> str:
        return "not reached" if v is None else f"{v['env_steps']:,} steps / {v['wall_s']:.1f} s"

    reached = ", ".join(f"{k}: {crossing(v)}" for k, v in summary["first_reached"].items())
    ret = summary["episode_return_mean"]
    print(f"done: {summary['env_steps']:,} env steps in {summary['wall_s']:.1f} s "
          f"({summary['sps']:,.0f} steps/s), mean return (last 100) "
          f"{'n/a' if ret is None else f'{ret:.1f}'}" + (f"; first reached {reached}" if reached else ""))
    print(f"run directory: {run_dir}")


def cmd_train(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    from lockstep.launch import train

    run_dir = Path(config.run.run_dir)
    summary = train(config, run_dir, token=security.token_from(args.token), resume=bool(args.resume))
    _print_summary(summary, run_dir)
    return 0


def cmd_learner(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    from lockstep.launch import train

    run_dir = Path(config.run.run_dir)
    summary = train(config, run_dir, token=security.token_from(args.token), resume=bool(args.resume),
                    local_actors=False)
    _print_summary(summary, run_dir)
    return 0


def cmd_actor(args: argparse.Namespace) -> int:
    from lockstep.actor import ActorOptions, run

    opts = ActorOptions(learner=args.learner, env=args.env, num_envs=args.num_envs, actor_id=args.actor_id,
                        connect_timeout=args.connect_timeout, retry_for_s=args.retry_for,
                        token=security.token_from(args.token), tls_ca=args.tls_ca,
                        tls_server_name=args.tls_server_name)
    return run(opts)


def cmd_plot(args: argparse.Namespace) -> int:
    from lockstep import plot

    axes = ("steps", "time") if args.x == "both" else (args.x,)
    try:
        groups = plot.group_runs(args.run_dirs, args.column)
        ylabel = plot.RETURN_LABEL if args.column == plot.RETURN_COLUMN else args.column
        runs = sum(len(g.curves) for g in groups)
        title = args.title or ", ".join(g.label for g in groups) + f": {runs} run{'s' if runs > 1 else ''}"
        out = plot.draw(groups, args.out, title, axes, ylabel=ylabel)
    except (plot.PlotUnavailable, ValueError) as err:
        print(f"lockstep: {err}", file=sys.stderr)
        return 2
    for group in groups:
        print(f"{group.label}: {plot.summary_line(plot.band(group.curves, axes[0]))}")
    print(f"wrote {out}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from lockstep.audit import main as audit_main

    return audit_main(args.run_dir, args.tolerance)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lockstep", description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train with a local learner and local actor processes")
    _add_training_flags(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("learner", help="run only the learner; actors connect to it")
    _add_training_flags(p)
    p.set_defaults(func=cmd_learner)

    p = sub.add_parser("actor", help="run one actor against a learner")
    p.add_argument("--learner", required=True,
                   help="learner address: host:port (gRPC), or unix:/path (an actor on the learner's host: "
                        "shared memory; the learner logs this address)")
    p.add_argument("--env", default="CartPole-v1",
                   help="Gymnasium id or package.module:callable (must match the learner's)")
    p.add_argument("--num-envs", type=int, default=4, help="environments in this actor's vector env")
    p.add_argument("--actor-id", type=int, default=0, help="distinct id per actor (seeds its envs and action noise)")
    p.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for each connection")
    p.add_argument("--retry-for", type=float, default=300.0,
                   help="seconds to keep reconnecting (exponential backoff with jitter) after losing the learner")
    p.add_argument("--token", help=f"the learner's shared secret (default ${security.TOKEN_ENV})")
    p.add_argument("--tls-ca", help="PEM CA certificate: connect with TLS and verify the learner against it")
    p.add_argument("--tls-server-name", help="name to verify in the learner's certificate, if not the host")
    p.set_defaults(func=cmd_actor)

    p = sub.add_parser("audit", help="recompute the behaviour log-probs of a run trained with --audit")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory of a `lockstep train --audit` run")
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest |recomputed - stored| log-prob accepted")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("plot", help="learning curves of runs: the mean and min-max across runs of one config")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (their metrics.csv)")
    p.add_argument("--x", choices=["steps", "time", "both"], default="both",
                   help="against env steps, wall time since training started, or both side by side (default)")
    p.add_argument("--out", required=True, metavar="FILE.png", help="the PNG to write")
    p.add_argument("--column", default="episode_return_mean20",
                   help="metrics.csv column to plot (default: episode_return_mean20, the mean of the last 20 "
                        "episodes)")
    p.add_argument("--title", help="figure title (default: the environments and the number of runs)")
    p.set_defaults(func=cmd_plot)
    bench_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        return args.func(args)
    except config_lib.ConfigError as err:
        print(f"lockstep: config error: {err}", file=sys.stderr)
        return 2
    except (security.SecurityError, FileNotFoundError) as err:
        print(f"lockstep: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lockstep: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
