"""Evaluation: play a trained policy in one process, with no learner and no gRPC (``lockstep eval RUN_DIR``).

What is loaded: ``RUN_DIR/config.yaml`` for the env id and the network, and a checkpoint (``--checkpoint``:
a file, or ``best`` for ``checkpoints/best.pt``, the version that scored best in evaluation while training;
else ``checkpoints/final.pt``, else the newest periodic ``checkpoints/iter_N.pt``: ``checkpoint.find``'s
``final``), read to the CPU with ``weights_only=True`` like every checkpoint (``checkpoint.load``). Its
trainer state holds the network (``model``) and the observation statistics (``obs_rms``) the snapshots
normalized with; the policy here is the one the learner served at that version.

How it plays and records video: ``learner.episodes``, the one episode loop, also evaluation while training's.

A PettingZoo parallel env (``pettingzoo:MODULE`` with a ``parallel_env()``) plays whole episodes of its env
with the policy acting for every agent (``episodes.play_parallel``); the report has each agent's returns
(until it left), each policy's (the returns of the agents it acts for: today every agent's policy is the run's
one, ``shared``) and the team's (each episode's agents' returns summed). Its ``return_*`` figures are per
agent, over every agent's episodes, as metrics.csv's ``episode_return_mean`` is.

A run that did not finish as it was asked (its summary.json says it failed or was stopped, or it has none:
still training, or killed) gets a warning (``unfinished``), on stderr and in eval.json: its checkpoint is
the policy it had when it ended, not the one its budget would have trained.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lockstep import config as config_lib
from lockstep.algo.normalize import ObsNormalizer, stored_moments
from lockstep.common.files import atomic_write
from lockstep.envs import SpaceSpec, selfplay
from lockstep.learner import checkpoint as checkpoint_lib
from lockstep.learner.device import prepare_device
from lockstep.learner.episodes import (
    Episode,
    EvalError,
    ModelOpponent,
    TeamEpisode,
    env_specs,
    load_config,
    make,
    make_slots,
    outcomes,
    parallel_module,
    play,
    play_parallel,
    policy_of_agents,
    policy_returns,
    slot_specs,
    slots_act,
    team_act,
)
from lockstep.models import Policy
from lockstep.models.load import PolicyMismatch, load_policy
from lockstep.observe.run_dir import RunDir


@dataclass
class EvalReport:
    """What ``lockstep eval`` played: the run, the checkpoint, each episode (``eval.json``)."""

    run_dir: str
    checkpoint: str
    iteration: int
    env_id: str
    deterministic: bool
    seed: int
    episodes: list[Episode | TeamEpisode] = field(default_factory=list)
    opponent: str | None = None  # a self-play game's opponent: random, self or a run directory
    # a self-play game's games that its opponent decided before the learning player moved: no episodes (they
    # are the learning player's games only), counted apart; the games played are both
    decided_before_move: int | None = None
    agents: list[str] | None = None  # a parallel env's agents (possible_agents order); None for other envs
    policy_of_agent: tuple[str, ...] = ()  # ... the policy that acts for each
    warning: str | None = None  # the run did not finish as it was asked (``unfinished``)

    @property
    def returns(self) -> np.ndarray:
        """[episodes] each episode's return (a parallel env's: the team return)."""
        return np.array([e.ret for e in self.episodes], np.float64)

    def agent_returns(self) -> dict[str, list[float]]:
        """A parallel env's agents' returns, episode by episode (an agent absent from an episode has none)."""
        return {a: [e.returns[a] for e in self.episodes if a in e.returns] for a in self.agents}

    def policy_returns(self) -> dict[str, list[float]]:
        """A parallel env's policies' returns: those of the agents each acts for (``episodes.policy_returns``)."""
        return policy_returns(self.episodes, self.agents, self.policy_of_agent)

    def to_dict(self) -> dict[str, Any]:
        lengths = np.array([e.length for e in self.episodes], np.float64)
        data = asdict(self)
        del data["agents"], data["policy_of_agent"]
        if self.agents is not None:
            return {**data, **self.team_figures(), "length_mean": float(lengths.mean())}
        returns = self.returns
        data["episodes"] = [{"return": e.ret, "length": e.length, "frames": e.frames, "video": e.video}
                            for e in self.episodes]
        data.update(return_mean=float(returns.mean()), return_std=float(returns.std()),
                    return_min=float(returns.min()), return_max=float(returns.max()),
                    length_mean=float(lengths.mean()))
        if self.opponent is not None:  # a two-player game: its outcome is the sign of the return
            data.update(self.outcomes(), games=len(self.episodes) + (self.decided_before_move or 0))
        return data

    def team_figures(self) -> dict[str, Any]:
        """A parallel env's episodes and figures: per agent over every agent's episodes (``return_*``), per
        policy, per agent and of the team."""
        agents = self.agent_returns()
        policies = self.policy_returns()
        return {
            "episodes": [{"team_return": e.ret, "length": e.length, "frames": e.frames, "video": e.video,
                          "agents": {a: {"return": r, "length": e.lengths[a]} for a, r in e.returns.items()}}
                         for e in self.episodes],
            **_figures([r for returns in agents.values() for r in returns], "return_"),
            "policies": {name: {"agents": [a for a, p in zip(self.agents, self.policy_of_agent, strict=True)
                                           if p == name], **_figures(returns)}
                         for name, returns in policies.items()},
            "agents": {agent: _figures(returns) for agent, returns in agents.items()},
            "team": _figures(list(self.returns)),
        }

    def outcomes(self) -> dict[str, float]:
        return outcomes(self.returns)


def _figures(returns: list[float], prefix: str = "") -> dict[str, Any]:
    """Mean, population std, min and max of ``returns``, and how many there are (NaN and 0 for none)."""
    values = np.array(returns, np.float64)
    if not len(values):
        return {f"{prefix}mean": math.nan, f"{prefix}std": math.nan, f"{prefix}min": math.nan,
                f"{prefix}max": math.nan, f"{prefix}count": 0}
    return {f"{prefix}mean": float(values.mean()), f"{prefix}std": float(values.std()),
            f"{prefix}min": float(values.min()), f"{prefix}max": float(values.max()), f"{prefix}count": len(values)}


def unfinished(run_dir: Path) -> str | None:
    """Why ``run_dir``'s policy may not be the one its run was to train: the run failed, was stopped before
    its step budget, or has no summary.json (it is still training, or was killed); None for a run that
    ended as it was asked (its step budget, ``run.time_limit_s`` or ``run.stop_at_return``)."""
    summary = RunDir(run_dir).summary()
    if summary is None:
        return f"{run_dir} has no summary.json: the run is still training, or was killed before it finished"
    if summary.get("error") or summary.get("status") == "failed":
        return f"{run_dir} failed ({summary.get('error')}) after {summary['env_steps']:,} env steps"
    if summary.get("status") == "stopped":
        return f"{run_dir} was stopped after {summary['env_steps']:,} env steps, before its step budget"
    return None


def load_from_checkpoint(run_dir: Path, checkpoint: str | None, observation: SpaceSpec, action: SpaceSpec,
                         device: torch.device) -> tuple[config_lib.Config, Policy, ObsNormalizer, Path, int]:
    """The run's config, its policy and observation normalizer from a checkpoint, the checkpoint's path
    and the iteration it was written at."""
    config, path, trainer = _stored(run_dir, checkpoint)
    if "policies" in trainer:
        raise EvalError(f"{path} holds several policies ({', '.join(trainer['policies'])}); a run of several "
                        "policies evaluates its PettingZoo parallel env")
    mean, var = stored_moments(trainer.get("obs_rms"))
    try:
        model, normalize = load_policy(config, observation, action, trainer["model"], mean, var, device, str(path))
    except PolicyMismatch as err:
        raise EvalError(str(err)) from err
    return config, model, normalize, path, int(trainer["iteration"])


def _stored(run_dir: Path, checkpoint: str | None) -> tuple[config_lib.Config, Path, dict[str, Any]]:
    """The run's config, the checkpoint ``checkpoint`` names (default: the final one) and its trainer's state."""
    config = load_config(run_dir)
    try:
        path = checkpoint_lib.find(RunDir(run_dir).checkpoints, checkpoint or checkpoint_lib.FINAL)
    except FileNotFoundError as err:
        raise EvalError(f"{err}; pass --checkpoint FILE to use another" if checkpoint is None else str(err)) from err
    return config, path, checkpoint_lib.load(path)["trainer"]


def evaluate(run_dir: Path, episodes: int = 10, deterministic: bool = False, seed: int = 0,
             device: str = "cpu", checkpoint: str | None = None, video_dir: Path | None = None,
             on_episode=None, opponent: str | None = None, torch_threads: int | None = None) -> EvalReport:
    """Play ``episodes`` episodes of the run's policy (module docstring); ``on_episode(i, episode)`` is
    called as each ends. A self-play game is played against ``opponent`` (``random``, the default; ``self``,
    the policy itself; or a run directory, its final policy), the learning seat alternating game by game; the
    games that the opponent decided before the learning player moved are no episodes, only counted
    (``decided_before_move``). Torch runs on ``torch_threads`` threads (default: the run's
    ``learner.torch_threads``, as its learner did), set for this whole process: a small network's one-row passes
    only lose time to more threads."""
    if episodes < 1:
        raise EvalError(f"--episodes must be at least 1, got {episodes}")
    if torch_threads is not None and torch_threads < 1:
        raise EvalError(f"--torch-threads must be at least 1, got {torch_threads}")
    torch_device = prepare_device(device)  # on a GPU in float32, as the learner served it
    config = load_config(run_dir)
    torch.set_num_threads(torch_threads or config.learner.torch_threads)
    env_config = config.env
    env_id = env_config.id
    if parallel_module(env_id) is not None:
        if opponent is not None:
            raise EvalError(f"--opponent plays a turn-based game's other seats; {env_id} is no self-play game")
        return _evaluate_parallel(run_dir, env_config, config.vector_kwargs(), episodes, deterministic, seed,
                                  torch_device, checkpoint, video_dir, on_episode)
    env = make(env_id, video_dir is not None, config.vector_kwargs())
    try:
        obs_spec, act_spec = env_specs(env, env_config)
        _, model, normalize, path, iteration = load_from_checkpoint(run_dir, checkpoint, obs_spec, act_spec,
                                                                    torch_device)
        report = EvalReport(str(run_dir), str(path), iteration, env_id, deterministic, seed,
                            warning=unfinished(run_dir))
        if isinstance(env.unwrapped, selfplay.SelfPlayGame):  # (under the episode statistics wrapper)
            report.opponent = opponent or "random"
            env.unwrapped.opponent = _opponent(report.opponent, model, normalize, (obs_spec, act_spec), seed,
                                               torch_device)
        elif opponent is not None:
            raise EvalError(f"--opponent plays a turn-based game's other seats; {env_id} is no self-play game")
        report.episodes = play(env, env_id, model, normalize, (obs_spec, act_spec), episodes, deterministic, seed,
                               torch_device, video_dir, on_episode)
        if report.opponent is not None:
            report.decided_before_move = env.unwrapped.vec.decided_before_move
        return report
    finally:
        env.close()


def _evaluate_parallel(run_dir: Path, env_config: config_lib.EnvConfig, kwargs: dict, episodes: int,
                       deterministic: bool, seed: int, device: torch.device, checkpoint: str | None,
                       video_dir: Path | None, on_episode) -> EvalReport:
    """``evaluate`` of a PettingZoo parallel env: the run's policy acting for every agent, on the env its actors
    built with ``kwargs`` (``Config.vector_kwargs``: with a centralized critic, slots that carry the global
    state, which the actor's network does not read)."""
    slots = make_slots(env_config.id, kwargs, video_dir is not None)
    try:
        specs = slot_specs(slots, env_config)
        if slots.policy_of:  # several policies: each acts for its own agents
            config, path, trainer = _stored(run_dir, checkpoint)
            if "policies" not in trainer:
                raise EvalError(f"{path} holds one policy; the run's config maps its agents to several")
            act = team_act(slots, config, trainer["policies"], deterministic, seed, device, str(path))
            iteration = int(trainer["iteration"])
        else:
            _, model, normalize, path, iteration = load_from_checkpoint(run_dir, checkpoint, *specs, device)
            act = slots_act(model, normalize, specs, deterministic, seed, device, len(slots.agents))
        report = EvalReport(str(run_dir), str(path), iteration, env_config.id, deterministic, seed,
                            agents=list(slots.agents), policy_of_agent=policy_of_agents(slots),
                            warning=unfinished(run_dir))
        report.episodes = play_parallel(slots, act, specs[0], episodes, seed, video_dir, on_episode)
        return report
    finally:
        slots.close()


def write_report(report: EvalReport, out: Path) -> Path:
    return atomic_write(out, json.dumps(report.to_dict(), indent=2) + "\n")


def _opponent(name: str, model: Policy, normalize: ObsNormalizer, specs: tuple[SpaceSpec, SpaceSpec], seed: int,
              device: torch.device) -> selfplay.Opponent:
    """``--opponent``: random legal moves, the policy itself, or the final policy of another run."""
    obs_spec, act_spec = specs
    if name == "random":
        return selfplay.RandomOpponent(obs_spec.mask or "action_mask", seed)
    if name == "self":
        return ModelOpponent(model, normalize, obs_spec, seed, device)
    _, other, other_normalize, _, _ = load_from_checkpoint(Path(name), None, obs_spec, act_spec, device)
    return ModelOpponent(other, other_normalize, obs_spec, seed, device)


def number(value: float) -> str:
    """A return as eval prints it: at least three significant digits and at least one decimal, so that a
    small return keeps its sign and size (-0.048 is ``-0.0480``, not ``-0.0``) and a large one its units
    (1443.27 is ``1443.3``); under 0.001 in scientific notation (``-4.8e-05``)."""
    if not math.isfinite(value) or value == 0:
        return f"{value:.1f}"
    if abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.{max(1, 2 - math.floor(math.log10(abs(value))))}f}"


def team_lines(report: EvalReport) -> list[str]:
    """A parallel env's figures: each policy's returns per agent, the team's, each agent's."""
    data = report.team_figures()

    def spread(figures: dict[str, Any]) -> str:
        std = "" if figures["count"] < 2 else f" ± {number(figures['std'])}"
        return f"{number(figures['mean'])}{std}"

    lines = [f"policy {name} ({', '.join(figures['agents'])}): mean return {spread(figures)} per agent over "
             f"{figures['count']} agent episodes" for name, figures in data["policies"].items()]
    team = data["team"]
    lines.append(f"team: mean return {spread(team)} over {team['count']} episodes (min {number(team['min'])}, max "
                 f"{number(team['max'])}; mean length {np.mean([e.length for e in report.episodes]):.1f})")
    lines += [f"{agent}: mean return {spread(figures)}" for agent, figures in data["agents"].items()]
    return lines


def summary_line(report: EvalReport) -> str:
    returns = report.returns
    lengths = [e.length for e in report.episodes]
    std = float(returns.std()) if len(returns) > 1 else math.nan
    spread = f" ± {number(std)}" if not math.isnan(std) else ""
    return (f"mean return {number(returns.mean())}{spread} over {len(returns)} "
            f"episode{'s' if len(returns) > 1 else ''} (min {number(returns.min())}, max {number(returns.max())}; "
            f"mean length {np.mean(lengths):.1f})"
            + ("" if report.opponent is None else
               ", against {}: win_rate {win_rate:.3f}, draw_rate {draw_rate:.3f}, loss_rate {loss_rate:.3f}".format(
                   report.opponent, **report.outcomes())
               + f"; {len(returns) + (report.decided_before_move or 0)} games played, "
                 f"{report.decided_before_move or 0} of them decided before the learning player moved (no episodes)"))


def main(run_dir: Path, *, episodes: int = 10, deterministic: bool = False, seed: int = 0, device: str = "cpu",
         checkpoint: str | None = None, video: str | None = None, out: str | None = None,
         opponent: str | None = None, torch_threads: int | None = None) -> int:
    """``lockstep eval``: play, print each episode and the summary, write eval.json; the exit code."""

    def show(i: int, episode: Episode | TeamEpisode) -> None:
        recorded = f", {episode.frames} frames in {episode.video}" if episode.video else ""
        if isinstance(episode, TeamEpisode):
            agents = ", ".join(f"{agent} {number(ret)}" for agent, ret in episode.returns.items())
            print(f"episode {i + 1}: team return {number(episode.ret)}, length {episode.length}{recorded}; {agents}",
                  flush=True)
        else:
            print(f"episode {i + 1}: return {number(episode.ret)}, length {episode.length}{recorded}", flush=True)

    try:
        report = evaluate(run_dir, episodes, deterministic, seed, device, checkpoint,
                          Path(video) if video else None, on_episode=show, opponent=opponent,
                          torch_threads=torch_threads)
    except EvalError as err:
        print(f"lockstep: {err}", file=sys.stderr)
        return 2
    path = write_report(report, Path(out) if out else run_dir / "eval.json")
    if report.warning is not None:  # beside the figures it qualifies
        print(f"lockstep: warning: {report.warning}; {Path(report.checkpoint).name} is no finished run's policy",
              file=sys.stderr, flush=True)
    played = (f"{report.env_id}, {Path(report.checkpoint).name} (iteration {report.iteration}), "
              f"{'deterministic' if deterministic else 'sampled'} actions")
    if report.agents is not None:
        print("\n  ".join([f"{played}:", *team_lines(report)]))
    else:
        print(f"{played}: {summary_line(report)}")
    print(f"wrote {path}")
    return 0
