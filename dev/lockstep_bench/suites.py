"""``lockstep bench learn --suite NAME``: the final return of presets at their budgets, against CleanRL's figures.

A *suite* is a list of presets (``SUITES``), or of presets with settings changed (``VARIANTS``);
``--suite`` also takes a comma-separated list of preset names and YAML paths (a custom suite). For
each entry and each seed, one real ``lockstep train`` process (progress off) trains the preset's
whole budget, ``ppo.total_steps`` times ``--budget-scale``; ``run.stop_at_return`` is cleared so
that every run ends at its budget (or at ``--time-limit-s``, when given). Afterwards:

    DIR/results.json   every run (with the env steps at which it first reached each of the config's
                       return thresholds), and per entry the mean ± std over seeds of the final return,
                       env steps, training seconds, env steps/s, the load average as its first run
                       started and its last ended, and CleanRL's published figure where there is one
    DIR/results.md     the same as a table, with the definitions and the sources
    DIR/ENTRY.png      learning curves: the mean and min-max over seeds against env steps and
                       against wall time (``lockstep.observe.plot``)
    DIR/ENTRY/         the resolved config.yaml, and per seed its run directory sSEED/ and log sSEED.log

A self-play game (a turn-based ``pettingzoo:`` id, e.g. the ``selfplay`` suite's connect-four) is also
played after training against uniformly random legal moves, ``GAMES`` games as ``lockstep eval RUN
--opponent random --deterministic`` plays them (the learning seat alternating): the run's *win rate
against random*, the figure its bounds are about (its training return is against its own pool).

*Final return* of a run: the mean undiscounted return of the last 100 episodes it finished
(``episode_return_mean`` of its ``summary.json``; the environment's own rewards, before any
reward scaling; the mean of all of them when fewer than 100 finished). With 1000-step
episodes (HalfCheetah, Ant) at 1M steps that is the last 10% of the run. The spread over
seeds is the population standard deviation (numpy's default, ddof 0).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lockstep import config as config_lib
from lockstep.envs import selfplay
from lockstep.observe import plot
from lockstep_bench import cell, runs

SUITES: dict[str, tuple[str, ...]] = {
    "classic": ("cartpole-cleanrl", "acrobot", "cartpole-masked-lstm", "cartpole-masked-mlp"),
    "minatar": ("minatar-breakout",),
    "minigrid": ("minigrid-doorkey",),
    "multiagent": ("mpe-spread", "mpe-spread-mappo"),  # the critic of the agent's own observation, and MAPPO's
    "selfplay": ("connect-four",),
    "mujoco": ("halfcheetah", "hopper", "walker2d", "ant"),
    "atari": ("pong", "breakout"),
    # a structured observation's policy against the flat one: CartPole-v1 and the same vector as a Dict
    "dict-split": ("cartpole-fast", "cartpole-fast-dict"),
}
# a suite member that is a preset with some settings changed: name -> (preset, KEY=VALUE settings)
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cartpole-fast-dict": ("cartpole-fast", ("env.id=lockstep.envs.tasks:SplitCartPole",)),
}
DEFAULT_SEEDS = 3  # as CleanRL's published tables

FINAL_RETURN = ("the mean undiscounted return of the last 100 episodes a run finished (summary.json "
                "episode_return_mean; the environment's own rewards, before any reward scaling; all of them "
                "when fewer than 100 finished)")
SPREAD = "population standard deviation over seeds (ddof 0)"
GAMES = 200  # a self-play game's games against random moves after training

CLEANRL_PPO = "https://docs.cleanrl.dev/rl-algorithms/ppo/"


@dataclass(frozen=True)
class Published:
    """A published result to compare an entry with: ``mean`` ± ``std`` at ``env_steps`` on ``env``."""

    env: str  # the environment id it was measured on (its version matters)
    mean: float
    std: float
    env_steps: int
    code: str  # the script that produced it
    source: str  # URL
    seeds: int | None = 3
    note: str = ""


PUBLISHED: dict[str, Published] = {
    "cartpole-cleanrl": Published("CartPole-v1", 490.04, 6.12, 500_000, "CleanRL ppo.py", CLEANRL_PPO + "#ppopy"),
    "acrobot": Published("Acrobot-v1", -86.36, 1.32, 500_000, "CleanRL ppo.py", CLEANRL_PPO + "#ppopy"),
    "halfcheetah": Published(
        "HalfCheetah-v4", 1442.64, 46.03, 1_000_000, "CleanRL ppo_continuous_action.py",
        CLEANRL_PPO + "#ppo_continuous_actionpy", note="v5 has the same dynamics and reward as v4"),
    "hopper": Published(
        "Hopper-v4", 2382.86, 271.74, 1_000_000, "CleanRL ppo_continuous_action.py",
        CLEANRL_PPO + "#ppo_continuous_actionpy",
        note="v5 pays the healthy reward only while healthy (v4 also on the terminal step)"),
    "walker2d": Published(
        "Walker2d-v4", 2287.95, 571.78, 1_000_000, "CleanRL ppo_continuous_action.py",
        CLEANRL_PPO + "#ppo_continuous_actionpy",
        note="v5 gives both feet the same friction (v4: 1.9 and 0.9) and pays the healthy reward only while healthy"),
    "ant": Published(
        "Ant-v4", 1777.42, 844.67, 8_000_000, "CleanRL ppo_continuous_action.py (8M steps)",
        "https://docs.cleanrl.dev/rl-algorithms/rpo/#experiment-results", seeds=None,
        note="the only CleanRL PPO figure for Ant: 8M steps, not 1M; v4 observes 27 values (v5: 105, with "
             "contact forces) and its reward has no contact cost"),
    "pong": Published(
        "PongNoFrameskip-v4", 20.36, 0.20, 10_000_000, "CleanRL ppo_atari.py", CLEANRL_PPO + "#ppo_ataripy",
        note="NoFrameskip-v4 with CleanRL's Atari wrappers, no sticky actions (ALE v5 ids default to "
             "repeat_action_probability 0.25)"),
    "breakout": Published(
        "BreakoutNoFrameskip-v4", 414.66, 28.09, 10_000_000, "CleanRL ppo_atari.py", CLEANRL_PPO + "#ppo_ataripy",
        note="NoFrameskip-v4 with CleanRL's Atari wrappers, no sticky actions (ALE v5 ids default to "
             "repeat_action_probability 0.25)"),
}



@dataclass(frozen=True)
class Bounds:
    """What a random policy scores on an entry's env and the return at which it counts as solved, for an env
    without a published PPO table to compare with."""

    env: str
    random: float  # mean return of uniformly random actions
    solved: float
    source: str  # where both figures come from


BOUNDS: dict[str, Bounds] = {
    "minigrid-doorkey": Bounds(
        "MiniGrid-DoorKey-5x5-v0", 0.04, 0.9,
        "random: 300 episodes of env.action_space.sample() on minigrid 3.2.0 (most time out at 250 steps with "
        "0); solved: the mean return 0.9+ reported for PPO on DoorKey-5x5 with rl-starter-files' settings "
        "(https://github.com/lcswillems/rl-starter-files, those of the preset); the reward 1 - 0.9 * steps / 250 "
        "is 0.9 or more for an episode of at most 27 steps"),
    "mpe-spread": Bounds(
        "mpe2 simple_spread_v3 (N=3, 25 steps, local_ratio 0.5), per-agent return", -27.0, -12.4,
        "random: 200 episodes of uniformly random actions (-27.0 +- 7.6 per agent); solved: a fixed assignment "
        "that steers agent i straight to landmark i (-12.4 +- 4.5 per agent over 200 episodes), a hand-written "
        "policy, not a published PPO figure: MAPPO's MPE results (Yu et al. 2021) use a centralized critic and "
        "report another average, so they are not quoted here"),
    "connect-four": Bounds(
        "PettingZoo connect_four_v3, win rate against uniformly random legal moves", 0.5, 0.9,
        "random: a random player against another wins about half the games, by symmetry (the seat alternates); "
        "solved: beating random moves in 90% of 200 games, the bar the self-play issue set (no published PPO "
        "figure for this game and opponent)"),
}
BOUNDS["mpe-spread-mappo"] = BOUNDS["mpe-spread"]  # the same env, with MAPPO's centralized critic

RUN_KEYS = ["seed", "run_dir", "final_return", "win_rate_random", "first_reached", "episodes", "env_steps", "wall_s",
            "sps", "process_s", "loadavg_start", "loadavg_end", "command", "error"]


@dataclass
class SuiteOptions:
    """What ``lockstep bench learn --suite`` runs."""

    suite: str  # a name in SUITES, or comma-separated preset names and YAML paths
    seeds: list[int] = field(default_factory=lambda: list(range(1, DEFAULT_SEEDS + 1)))
    budget_scale: float = 1.0  # multiplies each entry's ppo.total_steps
    overrides: list[str] = field(default_factory=list)  # KEY=VALUE for every run, as ``--set``
    transport: str | None = None  # actors.transport of every run; None: each config's
    time_limit_s: float | None = None  # run.time_limit_s of every run; None: each config's


@dataclass
class Entry:
    """One member of a suite: its name (a preset's, a variant's, or a YAML file's stem), where its config comes
    from, the settings a variant changes, and why it cannot run (None when it can)."""

    name: str
    source: str
    error: str | None = None
    settings: tuple[str, ...] = ()


def entries(suite: str) -> list[Entry]:
    """The members of ``suite``: a name in SUITES, or a comma-separated list of preset names and YAML paths.
    A member that is neither an existing file nor a preset carries an error that says so; an unknown suite
    name (one word that is no preset either) is a ConfigError that lists the suites."""
    presets = set(config_lib.preset_names())
    if suite in SUITES:
        names, what = list(SUITES[suite]), f"the {suite} suite"
    elif "," in suite or suite in presets or Path(suite).is_file():
        names, what = [s.strip() for s in suite.split(",") if s.strip()], "this suite"
    else:
        raise config_lib.ConfigError(f"unknown suite {suite!r}; suites: {', '.join(SUITES)} (or a comma-separated "
                                     "list of preset names and YAML files)")
    out = []
    for name in names:
        if Path(name).is_file():
            out.append(Entry(Path(name).stem, name))
        elif name in VARIANTS:
            preset, settings = VARIANTS[name]
            out.append(Entry(name, preset, settings=settings))
        elif name in presets:
            out.append(Entry(name, name))
        else:
            out.append(Entry(name, name, f"preset {name!r} does not exist ({what} lists it); presets: "
                                         f"{', '.join(sorted(presets))}"))
    return out


def build_config(entry: Entry, options: SuiteOptions) -> config_lib.Config:
    """The config every seed of ``entry`` trains with (seed aside): a variant's settings and the overrides
    applied, its budget scaled (at least one batch), no early stop, progress off."""
    config = config_lib.load(entry.source)
    config_lib.apply_sets(config, [*entry.settings, *options.overrides])
    if options.transport is not None:
        config_lib.set_value(config, "actors.transport", options.transport)
    if options.budget_scale <= 0:
        raise config_lib.ConfigError(f"--budget-scale must be positive, got {options.budget_scale:g}")
    config.ppo.total_steps = max(config.batch_size, round(config.ppo.total_steps * options.budget_scale))
    config.run.stop_at_return = None
    if options.time_limit_s is not None:
        config.run.time_limit_s = options.time_limit_s
    config.run.progress = False
    config.validate()
    return config


def published_for(entry: Entry, config: config_lib.Config) -> dict[str, Any] | None:
    """The published figure for ``entry``, with ``same_budget``: whether it was measured at the env steps this
    entry trains for (within one batch; CleanRL trains whole batches, 999,424 steps for its 1M)."""
    figure = PUBLISHED.get(entry.name)
    if figure is None:
        return None
    same = abs(figure.env_steps - config.ppo.total_steps) <= config.batch_size
    return {**asdict(figure), "same_budget": same}


def _loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def _train(config_path: Path, seed: int, run_path: Path, timeout_s: float | None) -> dict[str, Any]:
    """One seed: ``lockstep train`` in its own process; its row from summary.json."""
    shutil.rmtree(run_path, ignore_errors=True)  # this suite's own run of an earlier invocation
    row: dict[str, Any] = dict.fromkeys(RUN_KEYS)
    row.update(seed=seed, run_dir=str(run_path), loadavg_start=_loadavg())
    run = runs.train(config_path, run_path, run_path.with_suffix(".log"), timeout_s,
                     ("--seed", str(seed), "--name", f"{run_path.parent.name}-{run_path.name}"), cwd=run_path.parent)
    row.update(command=" ".join(run.command), process_s=round(run.process_s, 2), loadavg_end=_loadavg(),
               error=run.error)
    summary = run.run.summary()
    if summary is None:
        return row
    if summary.get("error") and not row["error"]:
        row["error"] = f"learner error: {summary['error']}"
    row.update(final_return=summary.get("episode_return_mean"), first_reached=summary.get("first_reached"),
               episodes=summary.get("episodes"),
               env_steps=summary.get("env_steps"), wall_s=summary.get("wall_s"), sps=summary.get("sps"))
    if selfplay.is_game(config_lib.load(config_path).env.id) and not row["error"]:
        row["win_rate_random"] = _win_rate_against_random(run_path)
    return row


def _win_rate_against_random(run_path: Path) -> float:
    """``lockstep eval RUN --episodes GAMES --opponent random --deterministic``: the share of games won."""
    from lockstep.tools import eval as evaluation

    report = evaluation.evaluate(run_path, episodes=GAMES, deterministic=True, opponent="random")
    return report.outcomes()["win_rate"]


def _mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    kept = [v for v in values if v is not None]
    if not kept:
        return None, None
    return round(float(np.mean(kept)), 2), round(float(np.std(kept)), 2)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per entry, over its seeds without an error: mean ± std of the final return, and means of env steps,
    training seconds and env steps/s."""
    ok = [r for r in rows if not r["error"]]
    mean, std = _mean_std([r["final_return"] for r in ok])
    win, win_std = _mean_std([r.get("win_rate_random") for r in ok])
    return {
        "seeds_ok": len(ok),
        "final_return_mean": mean,
        "final_return_std": std,
        "win_rate_random_mean": win,
        "win_rate_random_std": win_std,
        "env_steps": _mean_std([r["env_steps"] for r in ok])[0],
        "seconds": _mean_std([r["wall_s"] for r in ok])[0],
        "sps": _mean_std([r["sps"] for r in ok])[0],
        "loadavg_start": rows[0]["loadavg_start"] if rows else None,
        "loadavg_end": rows[-1]["loadavg_end"] if rows else None,
    }


def _plot(entry: Entry, env_id: str, rows: list[dict[str, Any]], published: dict[str, Any] | None,
          bounds: Bounds | None, out: Path) -> tuple[str | None, str | None]:
    """Draw ENTRY.png from the runs that recorded a return, with the published figure (else the solved return)
    as a reference line; (its file name, None) or (None, why not)."""
    curves = []
    for row in rows:
        if row["env_steps"] is None:
            continue
        curve = plot.read_curve(row["run_dir"])
        if len(curve.values):
            curve.name = f"seed {row['seed']}"
            curves.append(curve)
    if not curves:
        return None, "no run recorded a finished episode"
    reference = None
    if published is not None:
        budget = "" if published["same_budget"] else f" at {published['env_steps']:,} steps"
        reference = plot.Reference(f"CleanRL, {published['env']}{budget}: {published['mean']:g} ± "
                                   f"{published['std']:g}", published["mean"], published["std"])
    elif bounds is not None:
        reference = plot.Reference(f"solved: {bounds.solved:g} (random: {bounds.random:g})", bounds.solved, 0.0)
    seeds = f"{len(curves)} seed{'s' if len(curves) > 1 else ''}"
    path = out / f"{entry.name}.png"
    plot.draw([plot.Group(entry.name, curves, unit="seeds")], path, f"{env_id} ({entry.name}): {seeds}",
              reference=reference)
    return path.name, None


def run(options: SuiteOptions, out: Path, command: str) -> dict[str, Any]:
    """Run every entry of the suite, every seed in turn; write results.json, results.md and one PNG per entry.

    Entries that cannot run (a missing preset) are reported and skipped; when none can run, a ConfigError.
    """
    members = entries(options.suite)
    if all(e.error for e in members):
        raise config_lib.ConfigError("nothing to run: " + "; ".join(e.error for e in members))
    configs = {e.name: build_config(e, options) for e in members if not e.error}
    plot.require_matplotlib()  # before hours of training, not after
    import torch  # its version goes into the report

    out = out.resolve()  # each run's working directory is its entry's folder
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    report: dict[str, Any] = {
        "command": command, "suite": options.suite, "seeds": list(options.seeds),
        "budget_scale": options.budget_scale, "final_return": FINAL_RETURN, "spread": SPREAD,
        "curves": "mean and min-max over seeds of episode_return_mean20 (mean of the last 20 episodes), against "
                  "env steps and against training wall seconds",
        "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()], "entries": [],
    }
    for entry in members:
        record: dict[str, Any] = {"name": entry.name, "source": entry.source, "error": entry.error}
        report["entries"].append(record)
        if entry.error:
            print(f"[suite] {entry.name}: SKIPPED: {entry.error}", flush=True)
            continue
        config = configs[entry.name]
        folder = out / entry.name
        folder.mkdir(exist_ok=True)
        config_path = folder / "config.yaml"
        config_lib.save(config, config_path)
        limit = config.run.time_limit_s
        timeout_s = None if limit is None else 3 * limit + 120  # start-up, the last iteration past the cap, shutdown
        published = published_for(entry, config)
        bounds = BOUNDS.get(entry.name)
        record.update(env=config.env.id, settings=list(entry.settings), total_steps=config.ppo.total_steps,
                      batch_size=config.batch_size, thresholds=config.return_thresholds(), published=published,
                      bounds=None if bounds is None else asdict(bounds))
        rows = []
        for seed in options.seeds:
            print(f"[suite] {entry.name} seed {seed}: {config.env.id}, {config.ppo.total_steps:,} env steps ...",
                  flush=True)
            row = _train(config_path, seed, folder / f"s{seed}", timeout_s)
            rows.append(row)
            if row["error"]:
                print(f"[suite] {entry.name} seed {seed}: FAILED: {row['error']}", flush=True)
            else:
                print(f"[suite] {entry.name} seed {seed}: final return {cell(row['final_return'])} after "
                      f"{row['env_steps']:,} env steps, {row['wall_s']:.1f} s", flush=True)
        record.update(summarize(rows))
        record["plot"], record["plot_error"] = _plot(entry, config.env.id, rows, published, bounds, out)
        record["runs"] = rows
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["elapsed_s"] = round(time.perf_counter() - began, 1)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "results.md").write_text(markdown(report))
    return report


def failed(report: dict[str, Any]) -> bool:
    """Whether an entry could not run or a run failed."""
    return any(e["error"] or any(r["error"] for r in e.get("runs", [])) for e in report["entries"])


def _published_cell(p: dict[str, Any] | None) -> str:
    if p is None:
        return "none"
    text = f"{p['mean']:g} ± {p['std']:g} ({p['env']})"
    return text if p["same_budget"] else f"{text}, at {p['env_steps']:,} steps, not this budget"


def _reached_cell(entry: dict[str, Any]) -> str:
    """``THRESHOLD: steps, steps, ...``: where each seed's running mean return first reached the entry's highest
    threshold ("not reached", "failed"); "-" for an entry without a threshold."""
    if not entry.get("thresholds"):
        return "-"
    key = f"{max(entry['thresholds']):g}"
    steps = []
    for row in entry["runs"]:
        first = (row.get("first_reached") or {}).get(key)
        steps.append("failed" if row["error"] else "not reached" if first is None else cell(first["env_steps"]))
    return f"{key}: {', '.join(steps)}"


def markdown(report: dict[str, Any]) -> str:
    """results.md: one row per entry, then the definitions, the sources and the failures."""
    seeds = report["seeds"]
    lines = [
        "# lockstep bench learn --suite\n",
        f"`{report['command']}`: seeds {', '.join(map(str, seeds))}, budget scale {report['budget_scale']:g}; "
        f"{report['cpu_count']} CPU cores, torch {report['torch']}; load average (1, 5, 15 min) "
        f"{', '.join(map(str, report['loadavg_at_start']))} at start, "
        f"{', '.join(map(str, report['loadavg_at_end']))} at end; {report['elapsed_s']:g} s in all.\n",
        "| env (preset) | seeds ok | final return, mean ± std | env steps to threshold, per seed | "
        "win rate vs random | env steps | training s | env steps/s | load 1m start → end | CleanRL | curves |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in report["entries"]:
        if e["error"]:
            lines.append(f"| {e['name']} | not run | | | | | | | | | |")
            continue
        final = "n/a" if e["final_return_mean"] is None else \
            f"{cell(e['final_return_mean'])} ± {cell(e['final_return_std'])}"
        curves = f"[{e['plot']}]({e['plot']})" if e["plot"] else "none"
        per_seed = ", ".join(cell(r["win_rate_random"]) for r in e["runs"] if r.get("win_rate_random") is not None)
        win = "-" if e.get("win_rate_random_mean") is None else \
            f"{cell(e['win_rate_random_mean'])} ± {cell(e['win_rate_random_std'])} ({per_seed})"
        lines.append("| " + " | ".join([
            f"{e['env']} ({e['name']})", f"{e['seeds_ok']}/{len(e['runs'])}", final, _reached_cell(e), win,
            cell(e["env_steps"]),
            cell(e["seconds"]), cell(e["sps"]), f"{cell(e['loadavg_start'])} → {cell(e['loadavg_end'])}",
            _published_cell(e["published"]), curves]) + " |")
    lines += [
        "",
        f"*Final return*: {report['final_return']}; ± is the {report['spread']}. *Win rate vs random* (a "
        f"self-play game): the share of {GAMES} games won against uniformly random legal moves after training, "
        "the policy's mode playing, the seat alternating (per seed in brackets). *Env steps to threshold*: "
        "per seed, the env steps at which the mean return of the last 20 episodes first reached the config's "
        "highest return threshold (run.thresholds, else the env's reward_threshold; each run trains on to its "
        "budget). *env steps*, *training s* "
        "(from the learner's first phase to the end of training; process start-up excluded) and *env steps/s* "
        "are means over the seeds that finished. *load 1m*: the 1-minute load average as the entry's first run "
        "started and as its last ended; above the core count, other work competed for the CPUs. "
        f"*Curves*: the {report['curves']}; the shaded band is the min-max over seeds.",
        "",
        "Published figures (CleanRL's tables: the average episodic return, mean ± std over seeds):",
        "",
    ]
    for e in report["entries"]:
        p = e.get("published")
        if p:
            seeds_text = f", {p['seeds']} seeds" if p["seeds"] else ""
            note = f"; {p['note']}" if p["note"] else ""
            lines.append(f"- {e['name']}: {p['mean']:g} ± {p['std']:g} on {p['env']} at {p['env_steps']:,} env "
                         f"steps{seeds_text}, {p['code']}, <{p['source']}>{note}")
    none = [e["name"] for e in report["entries"] if not e["error"] and not e.get("published")]
    if none:
        lines.append(f"- no published CleanRL figure for: {', '.join(none)}")
    for e in report["entries"]:
        b = e.get("bounds")
        if b:
            lines.append(f"- {e['name']}: a random policy scores {b['random']:g} on {b['env']}, solved at "
                         f"{b['solved']:g} ({b['source']})")
    problems = [f"- {e['name']}: {e['error']}" for e in report["entries"] if e["error"]]
    problems += [f"- {e['name']} seed {r['seed']}: {r['error']}" for e in report["entries"]
                 for r in e.get("runs", []) if r["error"]]
    problems += [f"- {e['name']}: no curves: {e['plot_error']}" for e in report["entries"] if e.get("plot_error")]
    if problems:
        lines += ["", "Failures:", "", *problems]
    return "\n".join(lines) + "\n"
