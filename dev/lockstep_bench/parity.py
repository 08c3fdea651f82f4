"""Parity of an exported policy (``lockstep export``) with lockstep's own play on the same observations.

``reference`` plays the run's policy on its env as ``lockstep eval`` does (``learner.episodes``: the
checkpoint loaded by ``tools.eval.load_from_checkpoint``, the mode with ``deterministic``, else sampled from
``--seed``'s noise streams), one env, ``steps`` steps across episodes, and records each observation as the env
gave it, where episodes start, the noise it sampled from and the actions it handed the env. ``feeds`` lays those
out as the exported file's inputs (``exported_play``'s IN.npz), ``compare`` measures the file's outputs
against the actions: discrete parts must be equal, continuous ones within float32's rounding (``TOLERANCE``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lockstep.algo import noise
from lockstep.envs import SpaceSpec, stack_records
from lockstep.envs.spaces import slot_action
from lockstep.learner.episodes import env_specs, load_config, make, slots_act
from lockstep.tools.eval import load_from_checkpoint

PLAY = Path(__file__).with_name("exported_play.py")
# continuous actions: |exported - lockstep's| at most this relative to max(1, |action|): a few of float32's
# epsilons, from matrix products and transcendental functions that round differently in another runtime
TOLERANCE = 1e-5


@dataclass
class Played:
    observation: SpaceSpec
    records: np.ndarray  # [T] the observations as the env gave them (records for a Dict or Tuple)
    starts: np.ndarray  # [T] bool: an episode starts at the step
    uniforms: np.ndarray  # [T, W] float64 the noise each step sampled from (W = 0 with ``deterministic``)
    actions: dict[str, np.ndarray]  # output name -> [T, ...] the actions the env got
    rows: int = 1  # slots per step (a parallel env's agents of one policy): the arrays above are [T * rows], t-major


def _outputs(actions, T: int) -> dict[str, np.ndarray]:
    """Actions of one slot per step, as the env got them -> {the exported file's output name: [T, ...]}."""
    first = actions[0]
    if isinstance(first, dict):
        return {f"action.{path}": np.stack([a[path] for a in actions]) for path in first}
    if isinstance(first, tuple):
        return {f"action[{i}]": np.stack([a[i] for a in actions]) for i in range(len(first))}
    return {"action": np.stack([np.asarray(a) for a in actions])}


def reference(run_dir: Path, steps: int, seed: int = 0, deterministic: bool = True,
              checkpoint: str | None = None) -> Played:
    """Play ``steps`` steps of the run's policy as ``lockstep eval`` does (module docstring)."""
    config = load_config(run_dir)
    env = make(config.env.id, False, config.vector_kwargs())
    try:
        specs = env_specs(env, config.env)
        device = torch.device("cpu")
        _, model, normalize, _, _ = load_from_checkpoint(run_dir, checkpoint, *specs, device)
        act = slots_act(model, normalize, specs, deterministic, seed, device, 1)
        keys = noise.slot_keys(seed, 0, 1)  # the stream ``slots_act`` samples slot 0 from
        records, starts, uniforms, actions = [], [], [], []
        obs, _ = env.reset(seed=seed)
        start = True
        for t in range(steps):
            record = stack_records([obs], specs[0])  # [1]
            chosen = act(record, np.array([start]))
            records.append(record)
            starts.append(start)
            uniforms.append(noise.uniform(keys, np.full(1, t, np.uint64), model.noise_width)[0]
                            if not deterministic else np.zeros(0))
            one = slot_action(chosen, 0)
            actions.append(one)
            obs, _, terminated, truncated, _ = env.step(int(one) if specs[1].discrete else one)
            start = bool(terminated or truncated)
            if start:
                obs, _ = env.reset()
        return Played(specs[0], np.concatenate(records), np.array(starts), np.stack(uniforms),
                      _outputs(actions, steps))
    finally:
        env.close()


def reference_parallel(run_dir: Path, steps: int, seed: int = 0) -> dict[str, Played]:
    """``reference`` of a PettingZoo parallel env: ``steps`` steps of its agents acting as ``lockstep eval
    --deterministic`` plays them (``episodes.slots_act``, or ``team_act`` for several policies), recorded per policy:
    its agents' slots, their observations as the policy takes them and their part of the actions."""
    from lockstep.envs import EnvSpec, to_records
    from lockstep.learner import checkpoint as checkpoint_lib
    from lockstep.learner.episodes import SHARED_POLICY, make_slots, slot_specs, team_act
    from lockstep.learner.team import PolicyView
    from lockstep.observe.run_dir import RunDir

    config = load_config(run_dir)
    slots = make_slots(config.env.id, config.vector_kwargs(), False)
    try:
        specs = slot_specs(slots, config.env)
        A, device = len(slots.agents), torch.device("cpu")
        if slots.policy_of:
            path = checkpoint_lib.find(RunDir(run_dir).checkpoints, checkpoint_lib.FINAL)
            act = team_act(slots, config, checkpoint_lib.load(path)["trainer"]["policies"], True, seed, device,
                           str(path))
            spec = EnvSpec(config.env.id, *specs, agents=A, policy_of=slots.policy_of, agent_names=tuple(slots.agents))
            views = {name: PolicyView(spec, name, config.env.action_mask_key) for name in spec.policies}
        else:
            _, model, normalize, _, _ = load_from_checkpoint(run_dir, None, *specs, device)
            act, views = slots_act(model, normalize, specs, True, seed, device, A), {SHARED_POLICY: None}
        records, starts, actions = [], [], []
        obs, _ = slots.reset(seed=seed)
        first = np.ones(A, bool)
        for _ in range(steps):
            record = to_records(obs, specs[0])  # [A]
            chosen = act(record, first)
            records.append(record)
            starts.append(first)
            actions.append(chosen)
            obs, _, terminated, truncated, _ = slots.step(chosen)
            first = terminated | truncated
    finally:
        slots.close()
    played = {}
    for name, view in views.items():
        rows = np.arange(A) if view is None else view.columns(A)
        own = [r[rows] if view is None else view.obs(r[rows]) for r in records]
        parts = [a[name] if view is not None and view.action is not specs[1] else a for a in actions]
        played[name] = Played(specs[0] if view is None else view.observation, np.concatenate(own),
                              np.concatenate([s[rows] for s in starts]), np.zeros((steps * len(rows), 0)),
                              _rows(parts, rows), rows=len(rows))
    return played


def _rows(actions: list, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The actions of ``rows`` of each step, as a vector env takes them -> {output name: [T * rows, ...]}."""
    first = actions[0]
    if isinstance(first, dict):
        return {f"action.{path}": np.concatenate([a[path][rows] for a in actions]) for path in first}
    if isinstance(first, tuple):
        return {f"action[{i}]": np.concatenate([a[i][rows] for a in actions]) for i in range(len(first))}
    return {"action": np.concatenate([np.asarray(a)[rows] for a in actions])}


def feeds(card: dict, played: Played, batched: bool) -> dict[str, np.ndarray]:
    """The inputs of the file ``card`` describes for the steps of ``played``: [T, 1, ...] one step after another
    (a recurrent policy), or with ``batched`` [1, T, ...], every step a row of one batch (a feedforward one)."""
    N, B = len(played.records), played.rows
    T = N // B
    laid = {}
    for entry in card["inputs"]:
        name = entry["name"]
        if name == "state":
            continue
        if name == "noise":
            value = played.uniforms.astype(np.float32)  # as ``inference.act`` converts them
        elif name == "obs":
            value = played.records
        else:
            path = name[len("obs."):] if name.startswith("obs.") else name[len("obs"):]
            value = played.records[path]
        if name in card.get("channels_last", ()):  # the env gave it (H, W, C); lockstep's env made it [C, H, W]
            value = np.transpose(value, (0, 2, 3, 1))
        value = np.ascontiguousarray(value, np.dtype(entry["dtype"]))
        assert value.dtype == np.dtype(entry["dtype"]), (name, value.dtype, entry)
        laid[name] = value.reshape(1, N, *value.shape[1:]) if batched else value.reshape(T, B, *value.shape[1:])
    laid["_starts"] = played.starts.reshape(1, N) if batched else played.starts.reshape(T, B)
    return laid


def compare(card: dict, got: dict[str, np.ndarray], played: Played) -> dict[str, float]:
    """{output: max |exported - lockstep's|} of every action output; an AssertionError naming the output where a
    discrete part differs at all, a continuous one beyond ``TOLERANCE``, or a dtype is not the card's."""
    T = len(played.records)
    found = {}
    for entry in card["outputs"]:
        name = entry["name"]
        if name == "state_out":
            continue
        value = np.asarray(got[name])
        assert value.dtype == np.dtype(entry["dtype"]), f"{name}: dtype {value.dtype}, the card says {entry['dtype']}"
        value = value.reshape(T, *value.shape[2:])  # [steps * rows, ...] either way it was laid out
        expected = played.actions[name]
        assert value.shape == expected.shape, f"{name}: shape {value.shape}, lockstep's {expected.shape}"
        if np.dtype(entry["dtype"]).kind in "iub":
            assert np.array_equal(value, expected.astype(value.dtype)), f"{name}: {value} != lockstep's {expected}"
            found[name] = float(np.abs(value.astype(np.int64) - expected.astype(np.int64)).max(initial=0))
        else:
            diff = np.abs(value.astype(np.float64) - expected.astype(np.float64))
            bound = TOLERANCE * np.maximum(1.0, np.abs(expected))
            assert (diff <= bound).all(), f"{name}: differs by up to {diff.max():.3g} from lockstep's"
            found[name] = float(diff.max(initial=0))
    return found


def run_elsewhere(jobs: list[tuple[str, Path, dict[str, np.ndarray]]], timeout_s: float = 240) -> list[dict]:
    """Run ``(format, file, feeds)`` jobs in a fresh Python that does not import lockstep (``exported_play``): each
    job's outputs, {name: [T, B, ...]}. An AssertionError if lockstep was imported there after all."""
    with tempfile.TemporaryDirectory(prefix="lockstep-parity-") as tmp:
        listed = []
        for i, (fmt, path, laid) in enumerate(jobs):
            np.savez(Path(tmp) / f"in{i}.npz", **laid)
            listed.append({"format": fmt, "file": str(path), "inputs": f"{tmp}/in{i}.npz",
                           "outputs": f"{tmp}/out{i}.npz"})
        (Path(tmp) / "jobs.json").write_text(json.dumps(listed))
        done = subprocess.run([sys.executable, str(PLAY), f"{tmp}/jobs.json"], capture_output=True, text=True,
                              timeout=timeout_s, cwd=tmp)
        assert done.returncode == 0, done.stderr[-3000:]
        loaded = json.loads(done.stdout.strip().splitlines()[-1])
        assert loaded == [], f"the runtime's process imported {loaded}"
        results = []
        for job in listed:
            with np.load(job["outputs"]) as data:
                results.append({name: data[name] for name in data.files})
        return results


def run_here(fmt: str, path: Path, laid: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``run_elsewhere`` of one job in this process (cheaper: no interpreter to start)."""
    from lockstep_bench.exported_play import run

    card = json.loads(Path(f"{path}.json").read_text())
    return {name: np.stack(values) for name, values in run(fmt, str(path), laid, card).items()}
