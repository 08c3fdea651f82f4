"""lockstep: distributed PPO in the SEED architecture that stays on-policy.

Actors step Gymnasium environments and stream observations to one learner, which batches inference for
all of them and trains PPO only on transitions from the policy version it updates.

This module is the ``lockstep`` command. Heavy modules (torch) are imported inside the commands, so that
``lockstep actor`` and spawned actor processes never load torch; nor, until its command runs, gRPC.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep import config as config_lib
from lockstep.launch import ActorsGone
from lockstep.learner import RunFailed
from lockstep.observe.tracking import MissingExtra
from lockstep.transport.grpc import security

if TYPE_CHECKING:  # the parser loads no torch
    from lockstep.actor import ActorOptions
    from lockstep.learner.parts import Parts


def _metavar(s: config_lib.Setting) -> str:
    """How a value of ``s`` is written on the command line: ``{a,b}``, ``INT``, ``FLOAT|NONE``, ``INT,...``."""
    if s.choices:
        return "{" + ",".join(s.choices) + "}"
    if s.hint is bool:
        return "{true,false}"
    name = s.type_name()
    if name.startswith("list of "):
        return name.removeprefix("list of ").upper() + ",..."
    return name.replace(" or ", "|").upper()


def add_setting(p: argparse.ArgumentParser | argparse._ArgumentGroup, s: config_lib.Setting,
                *aliases: str) -> None:
    """The flags of one config field: ``--section.key`` and its short ``aliases``, with the field's help.
    The value stays text until ``config.set_value`` converts and checks it, as it does for ``--set``."""
    long = f"--{s.dotted}"
    if s.hint is not bool:
        p.add_argument(long, *aliases, dest=s.dotted, metavar=_metavar(s), help=s.help)
        return
    p.add_argument(long, dest=s.dotted, nargs="?", const="true", metavar=_metavar(s), help=s.help)
    flipped = "false" if s.default else "true"  # --audit turns auditing on, --no-progress the display off
    for alias in aliases:
        p.add_argument(alias, dest=s.dotted, action="store_const", const=flipped, help=f"same as {long} {flipped}")


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    """A flag for every config field, grouped by section: ``--section.key``, and the short flag it declares."""
    for section, cls in config_lib.sections().items():
        group = p.add_argument_group(section, (cls.__doc__ or "").strip())
        for s in config_lib.SETTINGS:
            if s.section == section:
                add_setting(group, s, *([s.flag] if s.flag else []))


def _add_training_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE_OR_PRESET",
                   help="a YAML config file or a preset name (" + ", ".join(config_lib.preset_names())
                        + f"); flags override it. Default: train uses the {config_lib.DEFAULT_PRESET} preset for "
                        "CartPole-v1; other --env values and the learner command use the built-in defaults "
                        "(CleanRL's settings)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue RUN_DIR from its newest checkpoint (its config.yaml; flags override it)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set ppo.ent_coef=0.0 (repeatable)")
    p.add_argument("--token", help=f"shared secret actors must present (default ${security.TOKEN_ENV}); "
                                   "required to listen off loopback")
    _add_config_flags(p)


class UsageError(Exception):
    """A command line that cannot work; the message names the fix (exit code 2)."""


def check_env(env_id: str, obs_keys: list[str] | tuple[str, ...] = (), action_mask_key: str = "",
              kwargs: dict | None = None) -> None:
    """Make one env of ``env_id`` before anything starts, so that an unknown id or a missing optional extra
    is one line that names the fix instead of a traceback from inside the learner or an actor."""
    import difflib

    import gymnasium as gym

    from lockstep import envs

    try:
        envs.env_spec(env_id, obs_keys, action_mask_key, kwargs)
    except gym.error.Error as err:  # DependencyNotInstalled names gymnasium's extra; ours wraps it
        extra = next((e for e in ("mujoco", "atari", "minatar") if e in str(err).lower()), None)
        fix = f" (with lockstep: pip install -e '.[{extra}]')" if extra else ""
        raise UsageError(f"{env_id}: {err}{fix}") from None
    except ValueError as err:
        if ":" in env_id or env_id in gym.registry:  # schemes suggest names themselves; not an unknown id
            raise UsageError(str(err)) from None
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
        names = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}" if close else ""
        hint = f"did you mean {names}?" if names else (
            "other forms: atari:GAME (e.g. atari:BreakoutNoFrameskip-v4), minatar:GAME, masked:ENV")
        raise UsageError(f"{err}; {hint}") from None


def resolve_config(args: argparse.Namespace) -> config_lib.Config:
    if args.resume:
        if args.config:
            raise config_lib.ConfigError("--resume uses RUN_DIR/config.yaml; give overrides as flags, not --config")
        source = Path(args.resume) / "config.yaml"
        if not source.is_file() and (Path(args.resume) / "rank0" / "config.yaml").is_file():
            source = Path(args.resume) / "rank0" / "config.yaml"  # several learners (torchrun): rank 0's, its seed
        config = config_lib.load(source)
        config.run.run_dir = args.resume
    elif args.config:
        config = config_lib.load(args.config)
    elif args.command == "train":
        config = config_lib.default_config(getattr(args, "env.id"))
    else:  # a lone learner: its actors start elsewhere, with env counts that no preset describes
        config = config_lib.Config()
    env_id, given = config.env.id, set()
    for s in config_lib.SETTINGS:  # the flags, then --set, override the file
        value = getattr(args, s.dotted, None)
        if value is not None:
            config_lib.set_value(config, s.dotted, value)
            given.add(s.dotted)
    given.update(config_lib.apply_sets(config, args.set))
    config_lib.drop_thresholds_of_another_env(config, env_id, given)
    config_lib.name_run(config)
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
    best = (summary.get("evaluation") or {}).get("best")
    if best:
        print(f"best evaluation: return {best['return_mean']:.1f} ± {best['return_std']:.1f} at iteration "
              f"{best['iteration']} ({best['env_steps']:,} env steps), {run_dir / 'checkpoints' / 'best.pt'}")
    print(f"run directory: {run_dir}")


def cmd_train(args: argparse.Namespace, parts: Parts | None = None) -> int:
    """``lockstep train``; ``parts``: the learner's replaceable parts (``learner.parts``; benchmarks)."""
    config = resolve_config(args)
    check_env(config.env.id, config.env.obs_keys, config.env.action_mask_key, config.vector_kwargs())
    from lockstep.launch.local import train
    from lockstep.learner.parts import DEFAULT_PARTS

    run_dir = Path(config.run.run_dir)
    summary = train(config, run_dir, token=security.token_from(args.token), resume=bool(args.resume),
                    parts=parts or DEFAULT_PARTS)
    _print_summary(summary, Path(config.run.run_dir))  # under torchrun, this rank's RUN_DIR/rankR
    return 0


def cmd_learner(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    check_env(config.env.id, config.env.obs_keys, config.env.action_mask_key, config.vector_kwargs())
    from lockstep.launch.local import train

    run_dir = Path(config.run.run_dir)
    summary = train(config, run_dir, token=security.token_from(args.token), resume=bool(args.resume),
                    local_actors=False)
    _print_summary(summary, run_dir)
    return 0


def actor_options(args: argparse.Namespace) -> ActorOptions:
    """``lockstep actor``'s options: its config fields (``ACTOR_SETTINGS``) read, converted and checked as the
    config reads them, so that the actor and ``lockstep train`` share one default and one check."""
    from lockstep.actor import ActorOptions  # imports numpy and gymnasium: only when an actor starts

    config = config_lib.Config()
    for dotted in ACTOR_SETTINGS:
        if getattr(args, dotted) is not None:
            config_lib.set_value(config, dotted, getattr(args, dotted))
    if args.policies:  # the learner's policies: which agents each acts for decides how the slots are laid out
        import yaml

        patterns = yaml.safe_load(args.policies)
        if not isinstance(patterns, dict):
            raise config_lib.ConfigError(f"--policies maps policy names to agent patterns, got {args.policies!r}")
        config.policies = config_lib.from_dict(
            {"policies": {name: {"agents": agents} for name, agents in patterns.items()}}).policies
    problem = config_lib.splits_problem(config.actors.envs_per_actor, config.actors.splits)
    if problem:
        raise config_lib.ConfigError(problem)
    return ActorOptions(learner=args.learner, env=config.env.id, obs_keys=tuple(config.env.obs_keys),
                        env_kwargs=config.vector_kwargs(),
                        envs_per_actor=config.actors.envs_per_actor, vector=config.actors.vector,
                        splits=config.actors.splits, actor_id=args.actor_id, connect_timeout=args.connect_timeout,
                        retry_for_s=args.retry_for,
                        token=security.token_from(args.token), tls_ca=args.tls_ca,
                        tls_server_name=args.tls_server_name)


def cmd_actor(args: argparse.Namespace) -> int:
    # gRPC's core logs each failed TLS handshake at INFO on stderr, and reads this once, when grpc is first
    # imported (nothing before this line imports it); the actor says what went wrong in one line of its own.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    opts = actor_options(args)
    check_env(opts.env, opts.obs_keys, kwargs=opts.env_kwargs)
    from lockstep.actor import run

    return run(opts)


# the config fields `lockstep actor` takes, with its flags for them (--num-envs: the name it had before)
ACTOR_SETTINGS = {"env.id": ("--env",), "env.obs_keys": ("--obs-keys",), "env.kwargs": ("--env-kwargs",),
                  "env.agent_id": ("--agent-id",), "env.action_mask_key": ("--action-mask-key",),
                  "env.image_layout": ("--image-layout",),
                  "actors.envs_per_actor": ("--envs-per-actor", "--num-envs"), "actors.vector": ("--vector",),
                  "actors.splits": ("--splits",),
                  "model.critic_input": ("--critic-input",)}  # global: the slots carry the env's state


def cmd_plot(args: argparse.Namespace) -> int:
    from lockstep.observe import plot

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
    from lockstep.tools.audit import main as audit_main

    return audit_main(args.run_dir, args.tolerance)


def cmd_eval(args: argparse.Namespace) -> int:
    from lockstep.tools import eval as evaluation

    return evaluation.main(Path(args.run_dir), episodes=args.episodes, deterministic=args.deterministic,
                           seed=args.seed, device=args.device, checkpoint=args.checkpoint, video=args.video,
                           out=args.out, opponent=args.opponent, torch_threads=args.torch_threads)


def cmd_export(args: argparse.Namespace) -> int:
    from lockstep.tools import export

    return export.main(Path(args.run_dir), fmt=args.format, out=args.out, checkpoint=args.checkpoint,
                       policy=args.policy, sample=args.sample)


def cmd_sweep(args: argparse.Namespace) -> int:
    """``lockstep sweep``: Optuna is an extra, imported only here."""
    from lockstep.sweep import spec as spec_lib

    try:
        spec = spec_lib.load(args.spec)
    except spec_lib.SpecError as err:
        raise UsageError(f"{args.spec}: {err}") from None
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UsageError("lockstep sweep runs on Optuna, which is not installed: pip install -e '.[sweep]'") from None
    from lockstep.sweep import report
    from lockstep.sweep.runner import Sweep

    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    out = Path(args.out)
    sweep = Sweep(spec, out, jobs=args.jobs, storage=args.storage, study_name=args.study or Path(args.spec).stem)
    study = sweep.run()
    for name, path in report.write(study, spec, out).items():
        print(f"wrote {path}" if name != "best.yaml" else f"wrote {path}: lockstep train --config {path}")
    if sweep.signum is not None:
        print("lockstep: interrupted; run the same command again to resume", file=sys.stderr)
        return 128 + sweep.signum
    return 0


# command -> (its line in `lockstep --help`, what it does, examples) for `lockstep COMMAND --help`
HELP = {
    "train": ("train on this machine: a learner and its actors",
              "Starts a learner in this process and --actors actors (processes on shared memory, or env loops in\n"
              "the learner with --transport inprocess), trains to --total-steps and writes the run directory:\n"
              "config.yaml, metrics.csv, summary.json, checkpoints/. Without --config: the cartpole-fast preset.",
              "lockstep train                                  # CartPole-v1 to a mean return of 475\n"
              "lockstep train --config halfcheetah --seed 2    # a preset or a YAML file; flags override it\n"
              "lockstep train --resume runs/NAME               # continue from the newest checkpoint"),
    "learner": ("run only the learner; actors connect to it from anywhere",
                "Serves actors over gRPC on --listen and, on this host, through the unix:/path address it logs.\n"
                "The first phase starts once --min-actors actors have said hello. Off loopback it needs a\n"
                "token (--token or $LOCKSTEP_TOKEN); --tls-cert and --tls-key add TLS.",
                "lockstep learner --env CartPole-v1 --listen 0.0.0.0:50051 --min-actors 4 --token SECRET"),
    "actor": ("run one actor: step environments, let the learner choose the actions",
              "Steps --envs-per-actor copies of --env and sends every observation to the learner at --learner.\n"
              "Exits 0 when training ends, 1 when no learner answers for --retry-for seconds, 2 when the\n"
              "learner refuses it or its TLS settings cannot work (the log line names the flag to fix), 3\n"
              "when its learner failed 3 times with no action in between (the log line names its error), 4\n"
              "when a process of one of its envs died (--vector async; the log line names the env).\n"
              "Imports no torch: requirements-actor.txt is all it needs.",
              "lockstep actor --learner learner-host:50051 --token SECRET --envs-per-actor 32 --actor-id 1\n"
              "lockstep actor --learner learner-host:50051 --tls-ca ca.pem --env atari:BreakoutNoFrameskip-v4"),
    "audit": ("check that a run trained with --audit was on-policy",
              "Recomputes every stored behaviour log-prob from the stored policy versions and prints one\n"
              "verdict: PASS (exit 0), FAIL (1) or NOTHING CHECKED (2).",
              "lockstep train --audit --run-dir runs/checked && lockstep audit runs/checked"),
    "eval": ("play a trained policy for N episodes; mp4 videos with --video",
             "Loads RUN_DIR's config and final checkpoint (or the newest periodic one) into this process (no\n"
             "learner, no gRPC) and plays --episodes episodes (atari: ids whole games, raw scores). Prints each\n"
             "return and length and the mean ± std, and writes RUN_DIR/eval.json. A PettingZoo parallel env's\n"
             "episodes are its env's, the policy acting for every agent: each policy's, the team's and each\n"
             "agent's returns. Warns when the run failed, was stopped or has not finished (no summary.json).",
             "lockstep eval runs/NAME --episodes 20 --deterministic\n"
             "lockstep eval runs/NAME --episodes 3 --video videos/   # videos/episode-000.mp4, ...\n"
             "lockstep eval runs/NAME --checkpoint best   # a run with --eval-every: its best evaluated version"),
    "export": ("write a trained policy as ONNX or TorchScript that runs without lockstep",
               "Loads RUN_DIR's policy as eval does and writes one file that takes the env's observation and returns\n"
               "the env's action, normalization, encodings, masks and clipping baked in, and beside it FILE.json,\n"
               "its card: the spaces, the input and output names, shapes and dtypes (docs/deploy.md). Deterministic\n"
               "(the most likely action) unless --sample. --format onnx needs pip install -e '.[export]'.",
               "lockstep export runs/NAME --format onnx --out cartpole.onnx\n"
               "lockstep export runs/NAME --format torchscript --checkpoint best --out policy.pt\n"
               "lockstep export runs/TEAM --format onnx --out exported/   # several policies: exported/NAME.onnx"),
    "plot": ("learning curves: the mean and min-max of runs that share a config",
             "Reads each RUN_DIR's metrics.csv, groups the runs whose config.yaml differs only in its run\n"
             "section, and draws each group against env steps and/or wall time (pip install -e '.[plot]').",
             "lockstep plot runs/CartPole-v1-s* --out cartpole.png"),
    "sweep": ("search hyperparameters with Optuna: trials are ordinary training runs",
              "Reads SPEC.yaml (a base config, the search space over config keys, the objective, the budget of each\n"
              "run; docs/sweeps.md), runs its trials as `lockstep train` processes under OUT/trials/, stops\n"
              "hopeless ones early, and writes OUT/trials.csv, OUT/best.yaml and plots (pip install -e '.[sweep]').\n"
              "Stopped, it resumes when run again; several processes given one --storage share the study.",
              "lockstep sweep cartpole.yaml --out sweeps/cartpole --jobs 2\n"
              "lockstep train --config sweeps/cartpole/best.yaml\n"
              "lockstep sweep cartpole.yaml --out sweeps/a --storage postgresql://host/db   # on several machines"),
}


def _command(sub, name: str) -> argparse.ArgumentParser:
    summary, description, examples = HELP[name]
    return sub.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}.\n\n{description}",
                          epilog="examples:\n  " + examples.replace("\n", "\n  "),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


EXAMPLES = """examples:
  lockstep train                                   # CartPole-v1 with the cartpole-fast preset
  lockstep train --config pendulum --seed 2        # presets: lockstep train --help, --config
  lockstep learner --listen 0.0.0.0:50051 --token SECRET      # then, on other machines:
  lockstep actor --learner learner-host:50051 --token SECRET --actor-id 1
  lockstep eval runs/NAME --episodes 10 --video videos/
  lockstep bench throughput --quick --out bench-results/throughput

Each command's --help gives its flags and examples."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lockstep", description="\n\n".join(__doc__.split("\n\n")[:2]),
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True)

    p = _command(sub, "train")
    _add_training_flags(p)
    p.set_defaults(func=cmd_train)

    p = _command(sub, "learner")
    _add_training_flags(p)
    p.set_defaults(func=cmd_learner)

    p = _command(sub, "actor")
    p.add_argument("--learner", required=True,
                   help="learner address: host:port (gRPC), or unix:/path (an actor on the learner's host: "
                        "shared memory; the learner logs this address)")
    for dotted, aliases in ACTOR_SETTINGS.items():
        add_setting(p, config_lib.setting_of(dotted), *aliases)
    p.add_argument("--policies", metavar="YAML",
                   help="a run of several policies: each one's agent patterns, as the learner's policies section "
                        "maps them, e.g. '{predator: [adversary_*], prey: [agent_*]}'")
    p.add_argument("--actor-id", type=int, default=0,
                   help="distinct id per actor (seeds its envs and action noise); with --splits S the learner sees "
                        "it as members ID*S .. ID*S+S-1: give every actor the same S")
    p.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for each connection")
    p.add_argument("--retry-for", type=float, default=300.0,
                   help="seconds to keep reconnecting (exponential backoff with jitter) after losing the learner")
    p.add_argument("--token", help=f"the learner's shared secret (default ${security.TOKEN_ENV})")
    p.add_argument("--tls-ca", help="PEM CA certificate: connect with TLS and verify the learner against it")
    p.add_argument("--tls-server-name", help="name to verify in the learner's certificate, if not the host")
    p.set_defaults(func=cmd_actor)

    p = _command(sub, "audit")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory of a `lockstep train --audit` run")
    p.add_argument("--tolerance", type=float, default=1e-5,
                   help="largest |recomputed - stored| log-prob accepted beyond float32's rounding of the log-prob's "
                        "terms (docs/reliability.md)")
    p.set_defaults(func=cmd_audit)

    p = _command(sub, "eval")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (its config.yaml and checkpoints/)")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="checkpoint to load: best (checkpoints/best.pt, the best evaluation while training), a "
                        "file (default: RUN_DIR/checkpoints/final.pt, else the newest iter_N.pt)")
    p.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    p.add_argument("--deterministic", action="store_true",
                   help="take the most likely action (argmax, or the Gaussian's mean) instead of sampling")
    p.add_argument("--seed", type=int, default=0, help="seeds the env's resets and the action noise (default 0)")
    p.add_argument("--video", metavar="DIR", help="write DIR/episode-NNN.mp4 per episode (pip install -e '.[video]')")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    p.add_argument("--torch-threads", type=int, metavar="N",
                   help="torch's threads (default: the run's learner.torch_threads, as its learner ran)")
    p.add_argument("--out", metavar="FILE.json", help="where to write the results (default RUN_DIR/eval.json)")
    p.add_argument("--opponent", metavar="random|self|RUN_DIR",
                   help="a turn-based game's opponent (default random): random legal moves, the policy itself, or "
                        "another run's final policy; eval.json gets win_rate, draw_rate and loss_rate over the "
                        "learning player's games, and the games the opponent decided before it moved "
                        "(decided_before_move, no episodes)")
    p.set_defaults(func=cmd_eval)

    p = _command(sub, "export")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (its config.yaml and checkpoints/)")
    p.add_argument("--checkpoint", metavar="final|best|FILE",
                   help="checkpoint to export: final (default: checkpoints/final.pt, else the newest iter_N.pt), best "
                        "(checkpoints/best.pt) or a file")
    p.add_argument("--policy", metavar="NAME", help="a run of several policies: the one to export (default: all, "
                                                    "into the folder --out)")
    p.add_argument("--format", required=True, choices=["onnx", "torchscript"], help="the file's format")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the file to write (its card: FILE.json); a folder: one file per policy, NAME.onnx or NAME.pt")
    p.add_argument("--sample", action="store_true",
                   help="sample as lockstep does from a noise input (uniforms, docs/deploy.md) instead of taking "
                        "the most likely action")
    p.set_defaults(func=cmd_export)

    p = _command(sub, "plot")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (their metrics.csv)")
    p.add_argument("--x", choices=["steps", "time", "both"], default="both",
                   help="against env steps, wall time since training started, or both side by side (default)")
    p.add_argument("--out", required=True, metavar="FILE.png", help="the PNG to write")
    p.add_argument("--column", default="episode_return_mean20",
                   help="metrics.csv column to plot (default: episode_return_mean20, the mean of the last 20 "
                        "episodes)")
    p.add_argument("--title", help="figure title (default: the environments and the number of runs)")
    p.set_defaults(func=cmd_plot)

    p = _command(sub, "sweep")
    p.add_argument("spec", metavar="SPEC.yaml", help="the sweep's spec (docs/sweeps.md)")
    p.add_argument("--out", required=True, metavar="OUT",
                   help="the sweep directory: OUT/trials/, the tables, best.yaml, plots, and the study (OUT/study.db) "
                        "by default")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="trials at once on this machine, each a process (default 1); runs step their envs in the "
                        "learner process where N runs' actor processes would not fit the cores")
    p.add_argument("--storage", metavar="URL",
                   help="an Optuna storage URL (e.g. postgresql://user:pass@host/db, sqlite:///path.db) that several "
                        "sweep processes share; default: OUT/study.db")
    p.add_argument("--study", metavar="NAME", help="the study's name in the storage (default: SPEC's file name)")
    p.set_defaults(func=cmd_sweep)
    _add_plugins(sub)
    return parser


# Packages beside the runtime add commands through this entry-point group: each entry is a callable that takes
# the subparsers and adds its own (``lockstep bench``, declared by dev/pyproject.toml), so that the runtime never
# imports them.
COMMANDS = "lockstep.commands"


def _add_plugins(sub: argparse._SubParsersAction) -> None:
    """The commands of the installed entry points in ``COMMANDS``; without the benchmarks, a ``bench`` that says
    how to install them."""
    from importlib.metadata import entry_points

    added = set()
    for entry in sorted(entry_points(group=COMMANDS), key=lambda e: e.name):
        entry.load()(sub)
        added.add(entry.name)
    if "bench" not in added:
        p = sub.add_parser("bench", help="benchmarks (needs the benchmark package: pip install -e ./dev)")
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_no_bench)


def _no_bench(args: argparse.Namespace) -> int:
    raise UsageError("lockstep bench needs the benchmark package, which lives beside the runtime in a checkout: "
                     "pip install -e ./dev (make test installs it)")


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the parsed command ``args.func``: its exit code, errors printed as one line with exit code 2 (1: the run or
    learner failed)."""
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        return args.func(args)
    except config_lib.ConfigError as err:
        print(f"lockstep: config error: {err}", file=sys.stderr)
        return 2
    except (security.SecurityError, FileNotFoundError, UsageError, MissingExtra) as err:
        print(f"lockstep: {err}", file=sys.stderr)
        return 2
    except RunFailed as err:  # its traceback was logged once, when it happened
        print(f"lockstep: {err} (its traceback is in the log above; summary.json records it)", file=sys.stderr)
        return 1
    except ActorsGone as err:  # each actor logged why it ended
        print(f"lockstep: the run failed: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # 128 + the signal: 130 for SIGINT, 143 for SIGTERM (launch.local.Interrupted)
        print("lockstep: interrupted", file=sys.stderr)
        return 128 + getattr(err, "signum", signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
