"""The ``lockstep`` command line. Heavy modules (torch) are imported inside commands, so that
``lockstep actor`` and spawned actor processes never load torch."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from lockstep import config as config_lib

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
    ("--min-actors", "learner.min_actors", "actors to wait for before the first phase (0: --actors)"),
    ("--stop-at-return", "run.stop_at_return", "stop once the running mean return reaches this"),
]


def _add_training_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file; flags override it")
    for flag, dotted, help_text in TRAINING_FLAGS:
        p.add_argument(flag, dest=dotted, default=None, help=f"{help_text} [{dotted}]")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set ppo.ent_coef=0.0 (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")


def resolve_config(args: argparse.Namespace) -> config_lib.Config:
    config = config_lib.load(args.config) if args.config else config_lib.Config()
    for _, dotted, _ in TRAINING_FLAGS:
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
    summary = train(config, run_dir)
    _print_summary(summary, run_dir)
    return 0


def cmd_learner(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    from lockstep.learner import Learner
    from lockstep.progress import Progress

    run_dir = Path(config.run.run_dir)
    learner = Learner(config, run_dir)
    import threading

    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(summary=learner.serve()), name="lockstep-learner")
    thread.start()
    try:
        port = learner.wait_ready(timeout=60)
        host = config.learner.listen.rsplit(":", 1)[0]
        print(f"learner listening on {host}:{port}; start actors with: "
              f"lockstep actor --learner {host}:{port} --env {config.env.id} --actor-id N", file=sys.stderr, flush=True)
        with Progress(config, enabled=config.run.progress) as progress:
            while thread.is_alive():
                thread.join(timeout=0.25)
                progress.update(learner.status)
    finally:
        learner.stop()
        thread.join()
    if "summary" not in outcome:
        return 1
    _print_summary(outcome["summary"], run_dir)
    return 0


def cmd_actor(args: argparse.Namespace) -> int:
    from lockstep.actor import ActorOptions, run

    opts = ActorOptions(learner=args.learner, env=args.env, num_envs=args.num_envs, actor_id=args.actor_id,
                        connect_timeout=args.connect_timeout)
    return run(opts)


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
    p.add_argument("--learner", required=True, help="learner address, host:port")
    p.add_argument("--env", default="CartPole-v1", help="Gymnasium id or package.module:callable (must match the learner's)")
    p.add_argument("--num-envs", type=int, default=4, help="environments in this actor's vector env")
    p.add_argument("--actor-id", type=int, default=0, help="distinct id per actor (seeds its envs and action noise)")
    p.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for the learner")
    p.set_defaults(func=cmd_actor)
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
    except KeyboardInterrupt:
        print("lockstep: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
