"""Evaluation while training (``run.eval_every``): episodes of the newest policy version, off the training path.

What is evaluated. Every ``eval_every``-th iteration, after its update and before the version it produced
is published, the trainer thread copies that version's parameters and observation statistics (to numpy,
on the CPU) and hands them to the evaluation process: a non-blocking put of one message. If the previous
evaluation is still running, this one is skipped and counted (``skipped_evaluations``): training never
waits for evaluation. The evaluation env is no actor: it never says hello, never passes the gate, and no
step of it enters a training batch, the episode statistics or the reward and observation normalizers.

Where it runs: a process of its own, spawned (as actors are: gRPC does not survive fork), not a thread
of the learner, because

* the episode loop is Python (an env step and a forward pass per step): in the learner's process it
  would take the GIL from the event loop that serves the actors and from the trainer thread;
* it builds its own network, so the learner's torch generator (part of every checkpoint) is untouched;
* it can be given a lower priority: the process runs at ``nice`` +10 with one torch thread, on the CPU
  (one observation per forward pass: a GPU would add a transfer per step and a second CUDA context),
  so on a 2-core machine the learner and the actors get the cores first and evaluation takes what
  they leave. It dies with the learner (``PR_SET_PDEATHSIG``, as local actors do).

How it plays: ``learner.episodes``' episode loop (``play``), the one ``lockstep eval`` uses: one env made as
``lockstep eval`` makes it (``training=False``: Atari's raw scores), the mode of the policy with
``run.eval_deterministic`` (else actions sampled from counter-based noise of the evaluation seed).
Each evaluation makes a fresh env and resets it with the same seed, so every version plays from the same
start states and noise, and two versions' figures differ by their policies only. The seed comes from
``run.seed`` (``eval_seed``) and is none of the reset seeds of the actors ``lockstep train`` starts.
With ``run.eval_video_every`` M, evaluations 1, M + 1, 2M + 1, ... record their episodes
(``RUN_DIR/videos/iter_NNNNNN/episode-NNN.mp4``); where the env cannot render or the video extra is
missing, the first such evaluation says why and the rest go on without video.

Self-play games (a turn-based ``pettingzoo:`` id). The episodes are games against random legal moves
(their returns, +1 win, 0 draw, -1 loss, are ``eval_return_*``), and, when ``selfplay.opponents`` is
``pool`` and the pool holds a snapshot, as many again against its oldest member (the trainer thread
copies that frozen snapshot's parameters into the request, as it copies the newest version's): the
win rates against each (``eval_win_rate_random``, ``eval_win_rate_oldest`` and ``eval_oldest_version``).
The learning seat alternates game by game, as in training.

PettingZoo parallel envs (``pettingzoo:MODULE`` with a ``parallel_env()``). The episodes are whole episodes of
one env, the policy acting for every agent (``episodes.play_parallel``, as ``lockstep eval`` plays them), each
policy for its own agents with several. ``eval_return_*`` are over the returns ``run.eval_rank_by`` names, which
also rank the versions for ``best.pt``: ``trained`` (the default), the agents' episode returns of the policies
that train (every agent's with one policy, as ``episode_return_mean`` is), so that a frozen opponent's returns,
or an adversary's, never make a version look better; ``team``, the episodes' team returns (their agents' returns
summed); or a policy's name, its agents' episode returns. ``eval_team_return_mean`` is always the mean team
return; summary.json and ``best.pt`` also hold each policy's mean return (``policies``) and the ranking
(``rank_by``).

What comes back: an ``EvalResult`` per evaluation. The report writes it into the next metrics row
(``eval_return_mean``, ``eval_return_std``, and ``eval_iteration`` and ``eval_env_steps`` of the version
evaluated). An evaluation whose mean return is higher than every earlier one of the run (a resumed run
continues from its ``best.pt``) is first written by the evaluation process as ``checkpoints/best.pt``,
atomically: the policy and its observation statistics with the evaluation's figures (no optimizer: a
run resumes from its periodic and final checkpoints, never from ``best.pt``). ``lockstep eval RUN
--checkpoint best`` plays it. When the run ends, the learner waits up to ``CLOSE_WAIT_S`` for the
evaluation in flight: its result reaches summary.json and ``best.pt``, but no metrics row.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The standard library only, here and in what this imports: the evaluation process loads this module before
# ``serve`` ties it to the learner; numpy, torch and the env packages load after, inside the functions.
from lockstep.common.process import die_with_parent

if TYPE_CHECKING:
    from lockstep.config import Config
    from lockstep.learner.inference import PolicySnapshot
    from lockstep.learner.trainer import Trainer

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 30.0  # at the end of a run: the longest the learner waits for the evaluation in flight
NICE = 10  # the evaluation process's priority below the learner's
EVAL_KEY = 0x6576616C  # spawn key of the evaluation seed's sequence ("eval"), beside the actors' [seed, actor id]


@dataclass
class EvalResult:
    """One finished evaluation of the version trained at ``iteration`` (``env_steps`` trained on by then)."""

    iteration: int
    env_steps: int
    version: int
    returns: list[float]  # [episodes] each episode's return, as the env recorded it (parallel env: those ranked)
    lengths: list[int]  # [episodes] (a parallel env's episodes: the env's steps)
    seconds: float  # wall time of the evaluation, in its process
    best: bool = False  # the best of the run so far: written as checkpoints/best.pt
    video: str | None = None  # the folder of its videos
    warning: str | None = None  # what it could not do (a video), and that evaluations go on without it
    error: str | None = None  # why it failed (then there are no returns)
    outcomes: dict[str, float] = dataclasses.field(default_factory=dict)  # a self-play game's win rates
    team_returns: list[float] = dataclasses.field(default_factory=list)  # a parallel env's [episodes], agents' summed
    policies: dict[str, float] = dataclasses.field(default_factory=dict)  # ... each policy's mean return per agent
    rank_by: str = ""  # ... which returns ``returns`` holds (``run.eval_rank_by``)

    @property
    def return_mean(self) -> float:
        return statistics.fmean(self.returns) if self.returns else math.nan

    @property
    def return_std(self) -> float:
        """The population std over the episodes (numpy's default, as ``lockstep eval`` reports it)."""
        return statistics.pstdev(self.returns) if self.returns else math.nan

    @property
    def team_return_mean(self) -> float:
        """A parallel env's mean team return; NaN for other envs."""
        return statistics.fmean(self.team_returns) if self.team_returns else math.nan

    FIGURES = ("iteration", "env_steps", "version", "episodes", "return_mean", "return_std")

    def figures(self) -> dict[str, Any]:
        """What summary.json and best.pt hold of it (the keys of ``FIGURES``, a game's ``outcomes``, and a
        parallel env's team return and policies' returns; its ``episodes`` are the env's)."""
        team = ({"team_return_mean": self.team_return_mean, "policies": dict(self.policies), "rank_by": self.rank_by}
                if self.team_returns else {})
        return {"iteration": self.iteration, "env_steps": self.env_steps, "version": self.version,
                "episodes": len(self.lengths), "return_mean": self.return_mean, "return_std": self.return_std,
                **self.outcomes, **team}


def eval_seed(config: Config) -> int:
    """The evaluation env's reset seed (also its noise seed): drawn from ``run.seed`` by a sequence of its own,
    and never one of the reset seeds of the envs of ``lockstep train``'s actors (members 0 .. actors.count x
    actors.splits - 1, ``actor.member_id``)."""
    import numpy as np

    from lockstep.envs import env_seeds

    group = config.actors.envs_per_actor // config.actors.splits
    taken = {s for member in range(config.actors.count * config.actors.splits)
             for s in env_seeds(config.run.seed, member, group)}
    sequence = np.random.SeedSequence(config.run.seed, spawn_key=(EVAL_KEY,))
    candidates = sequence.generate_state(len(taken) + 1, np.uint32).tolist()  # more than are taken: one is free
    return next((seed for seed in candidates if seed not in taken), max(taken) + 1)


class Evaluator:
    """The learner's side: the evaluation process, what is handed to it and what came back."""

    def __init__(self, config: Config, run_dir: Path, resume: bool) -> None:
        run = config.run
        self.every, self.video_every = run.eval_every, run.eval_video_every
        self.run_dir = run_dir
        self.seed = eval_seed(config)
        self.submitted = 0  # evaluations handed over
        self.finished = 0  # ... and come back with returns
        self.best: dict[str, Any] | None = _stored_best(run_dir, run.eval_rank_by) if resume else None  # of best.pt
        self.last: EvalResult | None = None
        self._in_flight: int | None = None  # the iteration being evaluated
        self._failed = False  # the process died: no more evaluations
        best = -math.inf if self.best is None else self.best["return_mean"]
        ctx = mp.get_context("spawn")
        self._requests, self._results = ctx.Queue(), ctx.Queue()
        self._process = ctx.Process(
            target=serve, name="lockstep-eval", daemon=True,
            args=(self._requests, self._results, str(run_dir), self.seed, run.eval_episodes,
                  run.eval_deterministic, best, os.getpid(), logging.getLogger().getEffectiveLevel()))
        self._process.start()
        log.info("evaluating every %d iteration(s): %d %s episode(s) on an env seeded %d, in process %d",
                 self.every, run.eval_episodes, "deterministic" if run.eval_deterministic else "sampled", self.seed,
                 self._process.pid)

    def due(self, iteration: int) -> bool:
        return not self._failed and iteration % self.every == 0

    def submit(self, trainer: Trainer, oldest: PolicySnapshot | None = None) -> bool:
        """Hand the trainer's current version to the evaluation process, with a self-play game's ``oldest``
        pool member to play against; False (skipped) while one is running. Runs on the trainer thread between
        the update and the publish; copies, never waits."""
        if self._in_flight is not None:
            return False
        video = bool(self.video_every) and self.submitted % self.video_every == 0
        team = getattr(trainer, "trainers", None)  # several policies (``learner.team``): each one's
        self._requests.put({"iteration": trainer.iteration, "env_steps": trainer.env_steps,
                            "version": trainer.version, "video": video, **(_policies(team) if team else {
                                "parameters": _numpy(trainer.model),
                                "obs_rms": None if trainer.obs_rms is None else trainer.obs_rms.state_dict()}),
                            "oldest": None if oldest is None else {
                                "version": oldest.version, "parameters": _numpy(oldest.model),
                                "obs_mean": oldest.obs_mean, "obs_var": oldest.obs_var}})
        self.submitted += 1
        self._in_flight = trainer.iteration
        return True

    def collect(self, timeout: float | None = None) -> EvalResult | None:
        """The evaluation that finished since the last call (waiting up to ``timeout``; None: not at all)."""
        if self._in_flight is None:
            return None
        try:
            result = self._results.get(timeout=timeout) if timeout else self._results.get_nowait()
        except queue.Empty:
            if not self._process.is_alive():
                log.error("the evaluation process died (exit code %s) evaluating iteration %d; evaluation stops, "
                          "training goes on", self._process.exitcode, self._in_flight)
                self._in_flight, self._failed = None, True
            return None
        self._in_flight = None
        if result.warning:
            log.warning("evaluation of iteration %d: %s", result.iteration, result.warning)
        if result.error:
            log.warning("evaluation of iteration %d failed: %s", result.iteration, result.error)
            return None
        self.finished += 1
        self.last = result
        if result.best:
            self.best = result.figures()
        log.info("evaluation of iteration %d (%d env steps): return %.1f ± %.1f%s over %d episodes in %.1f s%s%s",
                 result.iteration, result.env_steps, result.return_mean, result.return_std,
                 f" ({result.rank_by}), team return {result.team_return_mean:.1f}" if result.team_returns else "",
                 len(result.lengths), result.seconds,
                 "".join(f", {key} {value:g}" for key, value in result.outcomes.items()),
                 "; best so far, checkpoints/best.pt" if result.best else "")
        return result

    def close(self) -> EvalResult | None:
        """Stop the process, after the evaluation in flight (up to ``CLOSE_WAIT_S``): that evaluation's result."""
        last = None
        if self._in_flight is not None and self._process.is_alive():
            log.info("waiting up to %.0f s for the evaluation of iteration %d", CLOSE_WAIT_S, self._in_flight)
            last = self.collect(timeout=CLOSE_WAIT_S)
        if self._process.is_alive():
            self._requests.put(None)
            self._process.join(timeout=5.0)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=5.0)
        for q in (self._requests, self._results):
            q.cancel_join_thread()  # what the process never read is of no use now: exit without flushing it
            q.close()
        return last

    def summary(self, skipped: int) -> dict[str, Any]:
        """summary.json's ``evaluation``."""
        return {"every": self.every, "seed": self.seed, "finished": self.finished, "skipped": skipped,
                "best": self.best, "last": self.last and self.last.figures()}


def _policies(trainers: dict[str, Trainer]) -> dict[str, Any]:
    """What crosses to the evaluation process of several policies: each one's parameters and statistics."""
    return {"parameters": None, "obs_rms": None, "policies": {
        name: {"parameters": _numpy(t.model), "obs_rms": None if t.obs_rms is None else t.obs_rms.state_dict(),
               "version": t.version} for name, t in trainers.items()}}


def _numpy(model) -> dict[str, Any]:
    """A copy of ``model``'s parameters as numpy arrays, on the CPU: what crosses to the evaluation process."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def _tensors(parameters: dict[str, Any]) -> dict[str, Any]:
    """``_numpy``'s arrays as tensors again: a state dict, in the evaluation process."""
    import torch

    return {k: torch.from_numpy(v) for k, v in parameters.items()}


def _stored_best(run_dir: Path, rank_by: str) -> dict[str, Any] | None:
    """The figures of a resumed run's ``best.pt`` (``EvalResult.figures``; None without one, or with one ranked by
    other returns than ``rank_by``, which no return of this run's evaluations compares with): what a new best
    must beat, and the run's best until one does."""
    from lockstep.learner import checkpoint

    path = run_dir / "checkpoints" / checkpoint.BEST_FILE
    if not path.is_file():
        return None
    figures = checkpoint.load(path)["eval"]
    if figures.get("rank_by", rank_by) != rank_by:  # (a best.pt of an env without a team ranks its only returns)
        log.info("checkpoints/best.pt ranked versions by run.eval_rank_by %s, this run by %s: the next evaluation "
                 "is the best so far", figures["rank_by"], rank_by)
        return None
    return {key: figures[key] for key in EvalResult.FIGURES}


# -- the evaluation process ------------------------------------------------------------------------------


def serve(requests, results, run_dir: str, seed: int, episodes: int, deterministic: bool, best: float,
          parent: int, log_level: int) -> None:
    """Entry point of the evaluation process: evaluate each request (a version's parameters) until None."""
    die_with_parent(parent)  # before torch loads (seconds on a busy host)
    os.nice(NICE)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    import torch

    torch.set_num_threads(1)
    player = _Evaluation(Path(run_dir), seed, episodes, deterministic, best)
    while (request := requests.get()) is not None:
        results.put(player.evaluate(request))


class _Evaluation:
    """Inside the evaluation process: plays each version, keeps the best as checkpoints/best.pt."""

    def __init__(self, run_dir: Path, seed: int, episodes: int, deterministic: bool, best: float) -> None:
        from lockstep.envs.selfplay import is_game
        from lockstep.learner.episodes import load_config, parallel_module

        self.run_dir, self.seed, self.episodes, self.deterministic = run_dir, seed, episodes, deterministic
        self.best = best  # the mean return a new best.pt must beat
        self.config = load_config(run_dir)
        self.video = True  # until a video could not be made
        self.game = is_game(self.config.env.id)  # games are played against random moves and the oldest member
        self.parallel = parallel_module(self.config.env.id) is not None  # whole episodes, every agent acting
        self.agents: tuple[str, ...] = ()  # a parallel env's possible_agents, once it has been made
        self.policy_of: tuple[str, ...] = ()  # ... and the policy that acts for each

    def evaluate(self, request: dict[str, Any]) -> EvalResult:
        from lockstep.learner.episodes import EvalError, outcomes, policy_returns

        start = time.perf_counter()
        result = EvalResult(request["iteration"], request["env_steps"], request["version"], [], [], 0.0)
        video = self.run_dir / "videos" / f"iter_{result.iteration:06d}" if request["video"] and self.video else None
        try:
            try:
                played = self._play(request, video)
            except EvalError as err:
                if video is None:
                    raise
                result.warning, self.video, video = f"no video ({err}); evaluations go on without one", False, None
                played = self._play(request, None)
            result.returns, result.lengths = [e.ret for e in played], [e.length for e in played]
            if self.parallel:  # the returns ranked, the team's and each policy's (module docstring)
                grouped = policy_returns(played, list(self.agents), self.policy_of)
                result.team_returns = [e.ret for e in played]
                result.policies = {name: statistics.fmean(returns) for name, returns in grouped.items() if returns}
                result.rank_by = self.config.run.eval_rank_by
                result.returns = (result.team_returns if result.rank_by == "team" else
                                  [r for name in self._ranked() for r in grouped[name]])
            if self.game:
                result.outcomes["win_rate_random"] = outcomes(result.returns)["win_rate"]
                if request["oldest"] is not None:
                    oldest = request["oldest"]
                    against = [e.ret for e in self._play(request, None, oldest)]
                    result.outcomes["win_rate_oldest"] = outcomes(against)["win_rate"]
                    result.outcomes["oldest_version"] = oldest["version"]
        except Exception as err:  # the process stays for the next version; the learner logs it
            result.error = "".join(traceback.format_exception_only(err)).strip()
            result.returns, result.lengths, result.outcomes, result.team_returns, result.policies = [], [], {}, [], {}
            return result
        result.video = video and str(video)
        if result.return_mean > self.best:
            self._save_best(request, result)
        result.seconds = time.perf_counter() - start
        return result

    def _ranked(self) -> list[str]:
        """The policies whose agents' returns rank the versions (``run.eval_rank_by`` but ``team``): the policies that
        train, in the order of the run's, or the one named."""
        policies, rank_by = self.config.policies, self.config.run.eval_rank_by
        if rank_by != "trained":
            return [rank_by]
        return [name for name in dict.fromkeys(self.policy_of) if name not in policies or policies[name].train]

    def _play(self, request: dict[str, Any], video: Path | None, opponent: dict[str, Any] | None = None) -> list:
        """The episodes of the request's version; a self-play game's against random legal moves, or against
        ``opponent`` (the request's ``oldest``: a version's parameters and observation moments)."""
        import torch

        from lockstep.algo.normalize import stored_moments
        from lockstep.envs.selfplay import RandomOpponent
        from lockstep.learner.episodes import ModelOpponent, env_specs, make, play

        if self.parallel:
            return self._play_parallel(request, video)
        env = make(self.config.env.id, video is not None, self.config.vector_kwargs())
        try:
            specs = env_specs(env, self.config.env)
            mean, var = stored_moments(request["obs_rms"])  # of the whole observation, or of each Box leaf
            model, normalize = self._policy(specs, request["parameters"], mean, var, f"version {request['version']}")
            if self.game and opponent is None:
                env.unwrapped.opponent = RandomOpponent(specs[0].mask or "action_mask", self.seed)
            elif self.game:
                other, other_normalize = self._policy(specs, opponent["parameters"], opponent["obs_mean"],
                                                      opponent["obs_var"], f"version {opponent['version']}")
                env.unwrapped.opponent = ModelOpponent(other, other_normalize, specs[0], self.seed, torch.device("cpu"))
            return play(env, self.config.env.id, model, normalize, specs, self.episodes, self.deterministic,
                        self.seed, torch.device("cpu"), video)
        finally:
            env.close()

    def _play_parallel(self, request: dict[str, Any], video: Path | None) -> list:
        """The episodes of the request's version on a PettingZoo parallel env, acting for every agent; its agents
        (``possible_agents``) are kept as ``agents``."""
        import torch

        from lockstep.algo.normalize import stored_moments
        from lockstep.learner.episodes import (
            make_slots,
            play_parallel,
            policy_of_agents,
            slot_specs,
            slots_act,
            team_act,
        )

        env = self.config.env
        slots = make_slots(env.id, self.config.vector_kwargs(), video is not None)
        try:
            self.agents, self.policy_of = tuple(slots.agents), policy_of_agents(slots)
            specs = slot_specs(slots, env)
            if request.get("policies") is not None:  # several policies (``learner.team``): each for its own agents
                stored = {name: {"model": _tensors(policy["parameters"]), "obs_rms": policy["obs_rms"]}
                          for name, policy in request["policies"].items()}
                act = team_act(slots, self.config, stored, self.deterministic, self.seed, torch.device("cpu"),
                               f"version {request['version']}")
                return play_parallel(slots, act, specs[0], self.episodes, self.seed, video)
            mean, var = stored_moments(request["obs_rms"])
            model, normalize = self._policy(specs, request["parameters"], mean, var, f"version {request['version']}")
            act = slots_act(model, normalize, specs, self.deterministic, self.seed, torch.device("cpu"),
                            len(self.agents))
            return play_parallel(slots, act, specs[0], self.episodes, self.seed, video)
        finally:
            slots.close()

    def _policy(self, specs, parameters: dict[str, Any], mean, var, name: str):
        import torch

        from lockstep.models.load import load_policy

        return load_policy(self.config, *specs, _tensors(parameters), mean, var, torch.device("cpu"), name)

    def _save_best(self, request: dict[str, Any], result: EvalResult) -> None:
        from lockstep.learner import checkpoint

        trainer = {"iteration": result.iteration, "version": result.version, "env_steps": result.env_steps}
        if request.get("policies") is not None:  # as a checkpoint of several policies holds them
            trainer["policies"] = {name: {"model": _tensors(p["parameters"]), "obs_rms": p["obs_rms"],
                                          "version": p["version"]} for name, p in request["policies"].items()}
        else:
            trainer |= {"model": _tensors(request["parameters"]), "obs_rms": request["obs_rms"]}
        figures = {**result.figures(), "deterministic": self.deterministic, "seed": self.seed}
        checkpoint.save({"trainer": trainer, "eval": figures, "config": dataclasses.asdict(self.config)},
                        self.run_dir / "checkpoints" / checkpoint.BEST_FILE)
        self.best, result.best = result.return_mean, True
