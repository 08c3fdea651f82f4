"""Evaluation: play a trained policy in one process, with no learner and no gRPC (``lockstep eval RUN_DIR``).

What is loaded: ``RUN_DIR/config.yaml`` for the env id and the network, and a checkpoint (``--checkpoint``:
a file, or ``best`` for ``checkpoints/best.pt``, the version that scored best in evaluation while training;
else ``checkpoints/final.pt``, else the newest periodic ``checkpoints/iter_N.pt``: ``checkpoint.find``'s
``final``), read to the CPU with ``weights_only=True`` like every checkpoint (``checkpoint.load``). Its
trainer state holds the network (``model``) and the observation statistics (``obs_rms``) the snapshots
normalized with; the policy here is the one the learner served at that version.

How it plays and records video: ``learner.episodes``, the one episode loop, also evaluation while training's.
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
    env_specs,
    load_config,
    make,
    outcomes,
    play,
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
    episodes: list[Episode] = field(default_factory=list)
    opponent: str | None = None  # a self-play game's opponent: random, self or a run directory

    @property
    def returns(self) -> np.ndarray:
        return np.array([e.ret for e in self.episodes], np.float64)

    def to_dict(self) -> dict[str, Any]:
        returns, lengths = self.returns, np.array([e.length for e in self.episodes], np.float64)
        data = asdict(self)
        data["episodes"] = [{"return": e.ret, "length": e.length, "frames": e.frames, "video": e.video}
                            for e in self.episodes]
        data.update(return_mean=float(returns.mean()), return_std=float(returns.std()),
                    return_min=float(returns.min()), return_max=float(returns.max()),
                    length_mean=float(lengths.mean()))
        if self.opponent is not None:  # a two-player game: its outcome is the sign of the return
            data.update(self.outcomes())
        return data

    def outcomes(self) -> dict[str, float]:
        return outcomes(self.returns)


def load_from_checkpoint(run_dir: Path, checkpoint: str | None, observation: SpaceSpec, action: SpaceSpec,
                         device: torch.device) -> tuple[config_lib.Config, Policy, ObsNormalizer, Path, int]:
    """The run's config, its policy and observation normalizer from a checkpoint, the checkpoint's path
    and the iteration it was written at."""
    config = load_config(run_dir)
    try:
        path = checkpoint_lib.find(RunDir(run_dir).checkpoints, checkpoint or checkpoint_lib.FINAL)
    except FileNotFoundError as err:
        raise EvalError(f"{err}; pass --checkpoint FILE to use another" if checkpoint is None else str(err)) from err
    trainer = checkpoint_lib.load(path)["trainer"]
    mean, var = stored_moments(trainer.get("obs_rms"))
    try:
        model, normalize = load_policy(config, observation, action, trainer["model"], mean, var, device, str(path))
    except PolicyMismatch as err:
        raise EvalError(str(err)) from err
    return config, model, normalize, path, int(trainer["iteration"])


def evaluate(run_dir: Path, episodes: int = 10, deterministic: bool = False, seed: int = 0,
             device: str = "cpu", checkpoint: str | None = None, video_dir: Path | None = None,
             on_episode=None, opponent: str | None = None) -> EvalReport:
    """Play ``episodes`` episodes of the run's policy (module docstring); ``on_episode(i, episode)`` is
    called as each ends. A self-play game is played against ``opponent`` (``random``, the default; ``self``,
    the policy itself; or a run directory, its final policy), the learning seat alternating game by game."""
    if episodes < 1:
        raise EvalError(f"--episodes must be at least 1, got {episodes}")
    torch_device = prepare_device(device)  # on a GPU in float32, as the learner served it
    env_config = load_config(run_dir).env
    env_id = env_config.id
    env = make(env_id, video_dir is not None, env_config.kwargs)
    try:
        obs_spec, act_spec = env_specs(env, env_config)
        _, model, normalize, path, iteration = load_from_checkpoint(run_dir, checkpoint, obs_spec, act_spec,
                                                                    torch_device)
        report = EvalReport(str(run_dir), str(path), iteration, env_id, deterministic, seed)
        if isinstance(env.unwrapped, selfplay.SelfPlayGame):  # (under the episode statistics wrapper)
            report.opponent = opponent or "random"
            env.unwrapped.opponent = _opponent(report.opponent, model, normalize, (obs_spec, act_spec), seed,
                                               torch_device)
        elif opponent is not None:
            raise EvalError(f"--opponent plays a turn-based game's other seats; {env_id} is no self-play game")
        report.episodes = play(env, env_id, model, normalize, (obs_spec, act_spec), episodes, deterministic, seed,
                               torch_device, video_dir, on_episode)
        return report
    finally:
        env.close()


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


def summary_line(report: EvalReport) -> str:
    returns = report.returns
    lengths = [e.length for e in report.episodes]
    std = float(returns.std()) if len(returns) > 1 else math.nan
    spread = f" ± {std:.1f}" if not math.isnan(std) else ""
    return (f"mean return {returns.mean():.1f}{spread} over {len(returns)} episode{'s' if len(returns) > 1 else ''} "
            f"(min {returns.min():.1f}, max {returns.max():.1f}; mean length {np.mean(lengths):.1f})"
            + ("" if report.opponent is None else
               ", against {}: win_rate {win_rate:.3f}, draw_rate {draw_rate:.3f}, loss_rate {loss_rate:.3f}".format(
                   report.opponent, **report.outcomes())))


def main(run_dir: Path, *, episodes: int = 10, deterministic: bool = False, seed: int = 0, device: str = "cpu",
         checkpoint: str | None = None, video: str | None = None, out: str | None = None,
         opponent: str | None = None) -> int:
    """``lockstep eval``: play, print each episode and the summary, write eval.json; the exit code."""

    def show(i: int, episode: Episode) -> None:
        recorded = f", {episode.frames} frames in {episode.video}" if episode.video else ""
        print(f"episode {i + 1}: return {episode.ret:.1f}, length {episode.length}{recorded}", flush=True)

    try:
        report = evaluate(run_dir, episodes, deterministic, seed, device, checkpoint,
                          Path(video) if video else None, on_episode=show, opponent=opponent)
    except EvalError as err:
        print(f"lockstep: {err}", file=sys.stderr)
        return 2
    path = write_report(report, Path(out) if out else run_dir / "eval.json")
    print(f"{report.env_id}, {Path(report.checkpoint).name} (iteration {report.iteration}), "
          f"{'deterministic' if deterministic else 'sampled'} actions: {summary_line(report)}")
    print(f"wrote {path}")
    return 0
