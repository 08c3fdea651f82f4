"""Checkpoints: the one format for saving, loading and finding the ``.pt`` files of a run.

A checkpoint holds only tensors, numbers, strings and plain containers (numpy arrays
travel as tensors, the config as a plain dict), so ``torch.load(weights_only=True)``
reads it and a checkpoint from elsewhere cannot run code. ``load`` is also how the
audit reads its ``policy_vNNNNNN.pt`` files, which hold plain numpy arrays: the numpy
types such a file needs are allowed here, once, and nothing else is.

Every load maps tensors to the CPU: a checkpoint written on a GPU loads on a machine
without one, and the caller moves what it needs to its own device.

Which checkpoint (``find``): ``newest``, the highest iteration, periodic or final, is what
a resumed run continues from; ``final``, ``final.pt`` or else the newest periodic one, is
what ``lockstep eval`` plays; ``best``, ``best.pt``, is the policy that scored the highest mean return
in evaluation while training (``learner/evaluation.py``: a policy and its observation statistics, no
optimizer, so no run resumes from it); any other name is that file.

The ``Checkpointer`` owns the policy: a periodic checkpoint every N iterations
and/or every M minutes, the newest K kept, and a final one at the end of a run.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lockstep.common.files import atomic_write
from lockstep.config import ConfigError

_ARRAY = "__ndarray__"  # marks a numpy array stored as a tensor, so it loads back as an array
NEWEST, FINAL, BEST = "newest", "final", "best"  # the choices of ``find`` besides a file name
BEST_FILE = "best.pt"
HINT = ("a run writes checkpoints/final.pt when it ends (and checkpoints/iter_N.pt with "
        "--checkpoint-every N)")


def _numpy_globals() -> list:
    """What unpickling a plain numpy array needs: its reconstructor, ndarray, dtype and the dtype classes."""
    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype]
    return allowed + [getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith("DType")]


_NUMPY = _numpy_globals()


def _pack(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {_ARRAY: torch.from_numpy(np.array(value))}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _pack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_pack(v) for v in value)
    return value


def _unpack(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_ARRAY}:
            return value[_ARRAY].numpy()
        return {k: _unpack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unpack(v) for v in value)
    return value


def save(state: dict, path: Path) -> Path:
    return atomic_write(path, lambda f: torch.save(_pack(state), f))


def load(path: Path) -> dict:
    """The state saved at ``path``, every tensor on the CPU; an ``UnpicklingError`` for pickled code."""
    with torch.serialization.safe_globals(_NUMPY):
        return _unpack(torch.load(path, map_location="cpu", weights_only=True))


def periodic_path(directory: Path, iteration: int) -> Path:
    return directory / f"iter_{iteration:06d}.pt"


def periodic(directory: Path) -> list[Path]:
    """The periodic checkpoints in ``directory``, oldest first: by the iteration in the name, which has more
    than six digits from iteration 1,000,000 on (so the names' own order is not the iterations')."""
    found = [(int(match[1]), path) for path in directory.glob("iter_*.pt")
             if (match := re.fullmatch(r"iter_(\d+)\.pt", path.name))]
    return [path for _, path in sorted(found)]


def prune(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` periodic checkpoints."""
    found = periodic(directory)
    for old in found[:max(0, len(found) - keep)]:
        old.unlink()


def find(directory: Path, which: str = NEWEST) -> Path:
    """The checkpoint ``which`` names in ``directory`` (module docstring): ``newest``, ``final``, ``best``, or a
    file (a path, or a name in ``directory``). A ``FileNotFoundError`` that says what is missing."""
    if which == NEWEST:
        found = [(load(path)["trainer"]["iteration"], path)
                 for path in [*periodic(directory), directory / "final.pt"] if path.is_file()]
        if found:
            return max(found, key=lambda item: item[0])[1]  # the first of a tie: a periodic one
    elif which == FINAL:
        if (directory / "final.pt").is_file():
            return directory / "final.pt"
        found = periodic(directory)
        if found:
            return found[-1]
    elif which == BEST:
        if (directory / BEST_FILE).is_file():
            return directory / BEST_FILE
        raise FileNotFoundError(f"no {BEST_FILE} in {directory}: a run writes it when it evaluates while it "
                                f"trains (run.eval_every > 0, --eval-every N) and an evaluation has finished")
    else:
        for path in (Path(which), directory / which):
            if path.is_file():
                return path
        raise FileNotFoundError(f"checkpoint {which} does not exist")
    raise FileNotFoundError(f"no checkpoint in {directory}: {HINT}")


def by_iteration(directory: Path) -> dict[int, Path]:
    """Every checkpoint in ``directory`` by the iteration it holds (a periodic one where ``final.pt`` holds
    the same, as ``find`` prefers): what several learners choose their common resume point from."""
    found = {}
    for path in [directory / "final.pt", *directory.glob("iter_*.pt")]:
        if path.is_file():
            found[load(path)["trainer"]["iteration"]] = path
    return found


class Checkpointer:
    """When to checkpoint and how many to keep: every ``every`` iterations and/or ``minutes`` minutes, last ``keep``."""

    def __init__(self, directory: Path, every: int = 0, minutes: float = 0.0, keep: int = 3) -> None:
        self.directory, self.every, self.minutes, self.keep = directory, every, minutes, keep
        self._last = time.monotonic()

    def due(self, iteration: int) -> bool:
        by_count = bool(self.every) and iteration % self.every == 0
        by_time = bool(self.minutes) and time.monotonic() - self._last >= 60 * self.minutes
        return by_count or by_time

    def save_periodic(self, state: dict, iteration: int) -> Path:
        path = save(state, periodic_path(self.directory, iteration))
        prune(self.directory, self.keep)
        self._last = time.monotonic()
        return path

    def save_final(self, state: dict) -> Path:
        return save(state, self.directory / "final.pt")

    def newest(self, config: dict | None = None) -> tuple[Path, dict]:
        """What a resumed run continues from: the newest checkpoint and its state. With ``config`` (the
        resumed run's, as a plain dict) a ``ConfigError`` if it changes what the checkpoint needs (``check_resume``)."""
        try:
            path = find(self.directory, NEWEST)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"nothing to resume: {err}") from None
        state = load(path)
        if config is not None:
            check_resume(state.get("config"), config, path)
        return path, state


# The sections a resumed run must keep as its checkpoint has them: they say what the parameters mean
# (env: the environment, its spaces and how its observations and rewards are scaled, normalize_obs
# among them; model: the architecture, recurrent or not). So does ``policies``, which ``check_resume``
# compares policy by policy: which policies there are, in their order (an agent goes to the first whose
# patterns match it), the agents each acts for, and each one's network (the model section with its own keys
# over it). Anything else may change on a resume: the step budget, PPO's hyperparameters, the actors, the
# learner's address and device, logging, checkpoints, and whether a policy trains or is frozen.
FIXED_ON_RESUME = ("env", "model")
KEPT = "every env.* and model.* setting of its checkpoint and its policies, each one's agents and model"


def check_resume(stored: dict | None, config: dict, path: Path) -> None:
    """Refuse a resume whose ``config`` differs from the ``stored`` config of the checkpoint at ``path`` in a
    ``FIXED_ON_RESUME`` key or in what ``policies`` fixes: a ``ConfigError`` that names the key, both values and
    the checkpoint. A key one side lacks (a checkpoint from before it existed) is not compared; nor is anything
    without a stored config."""
    if stored is None:
        return
    for section in FIXED_ON_RESUME:
        _compare(section, stored.get(section) or {}, config.get(section) or {}, path)
    if "policies" in stored and "policies" in config:
        _check_policies(stored, config, path)


def _check_policies(stored: dict, config: dict, path: Path) -> None:
    old, new = stored["policies"] or {}, config["policies"] or {}
    if list(old) != list(new):
        raise ConfigError(
            f"--resume: policies are {list(new) or 'none'}, but the checkpoint {path.name} was trained with "
            f"{list(old) or 'none'}; a resumed run keeps {KEPT} (they decide what its parameters mean and whose "
            f"they are): resume with the checkpoint's policies, in its order, or start a new run")
    for name in old:
        _compare(f"policies.{name}", {"agents": old[name].get("agents")}, {"agents": new[name].get("agents")}, path)
        # the network the policy has: the model section with its own keys over it (the section itself is
        # compared above, so a difference here is in the policy's own keys)
        _compare(f"policies.{name}.model", {**(stored.get("model") or {}), **(old[name].get("model") or {})},
                 {**(config.get("model") or {}), **(new[name].get("model") or {})}, path)


def _compare(prefix: str, old: dict, new: dict, path: Path) -> None:
    for key in sorted(set(old) & set(new)):
        if old[key] != new[key]:
            raise ConfigError(
                f"--resume: {prefix}.{key} is {new[key]!r}, but the checkpoint {path.name} was trained with "
                f"{old[key]!r}; a resumed run keeps {KEPT} (they decide what its parameters mean): resume with "
                f"{prefix}.{key} = {old[key]!r}, or start a new run")
