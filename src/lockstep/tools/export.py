"""Export: a trained policy as one ONNX or TorchScript file that runs without lockstep (``lockstep export RUN_DIR``).

What is loaded: what ``lockstep eval`` loads (``tools.eval``): the run's config, a checkpoint (``--checkpoint``
final, best or a file) with its network and observation statistics, rebuilt by ``models.load``.

What the file computes, from the observation as lockstep's env of the run gives it (``envs.make_env``: for a
Gymnasium id, ``gym.make``'s env; a channels-last image leaf is the [C, H, W] one ``env.image_layout`` makes of it)
to the action the env takes (``ExportedPolicy``), everything that lies between the two in ``lockstep eval
--deterministic`` (``learner.episodes``) baked in:

- observation normalization with the checkpoint's statistics, clipped to ``env.clip_obs`` (``ObsNormalizer``);
- the encoders of the network: one-hot Discrete and MultiDiscrete leaves, image pixels scaled by the space's bound;
- the action mask, where the policy has one: the mask leaf is an input as every other leaf, and forbidden choices
  get the masked logit (``Policy.masked``);
- the most likely action (each Categorical's argmax, the Gaussian's mean), or with ``sample`` the action lockstep
  samples from a noise input (``inference.act``: uniforms in (0, 1) clamped as there, Gumbel-max and Box-Muller);
- the action as the actor hands it to the env (``envs.spaces.env_actions``): Box parts clipped to their bounds,
  the other parts in their leaves' shapes and dtypes, a Dict or Tuple action as one output per part.

Inputs and outputs, in this order (the JSON card beside the file lists them with shapes and dtypes; every input and
output has a leading batch dimension):

- ``obs`` (a flat observation) or ``obs.PATH`` for each leaf of a Dict or Tuple observation (``obs.image``,
  ``obs.goal.position``, ``obs[0]``), in the leaf's own dtype (uint8 images as uint8, Discrete leaves as int64);
- ``state`` [B, S] float32 (a recurrent policy): zeros where an episode starts, else the last ``state_out``;
- ``noise`` [B, W] float32 (``sample`` only): uniforms in (0, 1), lockstep's ``algo.noise`` streams;
- ``action`` (a flat action) or ``action.PATH`` per part of a Dict or Tuple action (``action.go``, ``action[0]``);
- ``state_out`` [B, S] float32 (a recurrent policy).

ONNX is written by torch's TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``, opset
``OPSET``): it traces the same graph TorchScript does in a fraction of a second and needs no package beyond
torch, where the torch.export-based one takes seconds per file and needs onnxscript; onnxruntime refuses a wrong
input's dtype or shape by the input's name. TorchScript is ``torch.jit.trace`` of the same module behind a
scripted ``forward`` that does the same (``_checked``) and takes the inputs by name.

A PettingZoo parallel env's policy takes one agent's observation (a slot's: its leaves, ``agent_active``,
``agent_id``); with several policies, each policy's own part of it.
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from lockstep.algo.normalize import ObsNormalizer, stored_moments
from lockstep.common.files import atomic_write
from lockstep.envs import SpaceSpec, action_entries
from lockstep.learner.episodes import (
    SHARED_POLICY,
    EvalError,
    env_specs,
    load_config,
    make,
    make_slots,
    parallel_module,
    slot_specs,
)
from lockstep.models import Policy
from lockstep.models.load import PolicyMismatch, load_policy
from lockstep.observe.run_dir import RunDir

FORMATS = ("onnx", "torchscript")
SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}
OPSET = 17
BATCH = "batch"  # the name of every input's and output's leading dimension in the card and the ONNX graph
_TINY = float(np.finfo(np.float32).tiny)
_BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))


def _channels_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    """[C, H, W] -> (H, W, C)."""
    channels, height, width = shape
    return height, width, channels


def _torch_dtype(dtype: str | np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, np.dtype(dtype))).dtype


def _name(prefix: str, path: str) -> str:
    """An input's or output's name: ``prefix`` for a flat space, else ``prefix.PATH`` (``prefix[i]`` for a Tuple)."""
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


class _Normalize(nn.Module):
    """``ObsNormalizer`` as a module: the same operations in the same order, its statistics as buffers."""

    def __init__(self, normalize: ObsNormalizer, observation: SpaceSpec) -> None:
        super().__init__()
        self.clip = float(normalize.clip)
        self.tree = observation.tree
        leaves = getattr(normalize, "leaves", {}) if self.tree else ({"": (normalize.mean, normalize.scale)}
                                                                      if normalize.enabled else {})
        self.paths = [path for path, _ in observation.leaf_specs()]
        self.normalized = [path in leaves for path in self.paths]
        for i, path in enumerate(self.paths):
            if path in leaves:
                mean, scale = leaves[path]
                self.register_buffer(f"mean_{i}", mean.detach().cpu().clone())
                self.register_buffer(f"scale_{i}", scale.detach().cpu().clone())

    def forward(self, leaves: list[torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        out = []
        for i, x in enumerate(leaves):
            if self.normalized[i]:
                mean, scale = getattr(self, f"mean_{i}"), getattr(self, f"scale_{i}")
                x = ((x.float() - mean) * scale).clamp(-self.clip, self.clip)
            elif not self.tree:
                x = x.float()  # a flat observation reaches the network as float32, normalized or not
            out.append(x)
        return dict(zip(self.paths, out)) if self.tree else out[0]


class ExportedPolicy(nn.Module):
    """The env's observation -> the env's action (module docstring): inputs and outputs in ``inputs()`` and
    ``outputs()``' order, one tensor each, batch first."""

    def __init__(self, model: Policy, normalize: ObsNormalizer, observation: SpaceSpec, action: SpaceSpec,
                 sample: bool = False, channels_last: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.model = model.cpu().eval().requires_grad_(False)
        # the leaves the env gives as (H, W, C) images, which lockstep's env transposes to [C, H, W] (``envs.images``)
        self.transposed = [path in channels_last for path, _ in observation.leaf_specs()]
        self.normalize = _Normalize(normalize, observation)
        self.observation, self.action, self.sample = observation, action, sample
        self.leaves = len(observation.leaf_specs())
        self.recurrent = model.state_size > 0
        self.parts: list[tuple[int, int, tuple[int, ...], torch.dtype, bool]] = []  # first, size, shape, dtype, box
        for i, (_, leaf, first, size) in enumerate(action_entries(action)):
            box = leaf.kind == "box"
            self.parts.append((first, size, tuple(leaf.shape), _torch_dtype(leaf.dtype), box))
            if box:  # as the actor clips (``env_actions``): to the bounds in float32
                self.register_buffer(f"low_{i}", torch.as_tensor(leaf.low.astype(np.float32)))
                self.register_buffer(f"high_{i}", torch.as_tensor(leaf.high.astype(np.float32)))

    def inputs(self) -> list[tuple[str, tuple[int | str, ...], str]]:
        """(name, shape, numpy dtype) of each input, in order."""
        found = [(_name("obs", path), (BATCH, *(_channels_last(leaf.shape) if transposed else leaf.shape)),
                  np.dtype(leaf.dtype).name)
                 for (path, leaf), transposed in zip(self.observation.leaf_specs(), self.transposed)]
        if self.recurrent:
            found.append(("state", (BATCH, self.model.state_size), "float32"))
        if self.sample:
            found.append(("noise", (BATCH, self.model.noise_width), "float32"))
        return found

    def outputs(self) -> list[tuple[str, tuple[int | str, ...], str]]:
        """(name, shape, numpy dtype) of each output, in order."""
        found = [(_name("action", path), (BATCH, *leaf.shape), "float32" if leaf.kind == "box"
                  else np.dtype(leaf.dtype).name) for path, leaf, _, _ in action_entries(self.action)]
        if self.recurrent:
            found.append(("state_out", (BATCH, self.model.state_size), "float32"))
        return found

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        # [B, H, W, C] -> [B, C, H, W], contiguous as ``envs.images`` makes it
        leaves = [x.permute(0, 3, 1, 2).contiguous() if transposed else x
                  for x, transposed in zip(inputs[: self.leaves], self.transposed)]
        obs = self.normalize(leaves)
        batch = inputs[0].shape[0]
        at = self.leaves
        if self.recurrent:
            state = inputs[at]
            at += 1
        else:
            state = torch.zeros((batch, 0))
        if self.sample:
            noise = inputs[at].clamp(_TINY, _BELOW_ONE)  # as ``inference.act``: Gumbel noise of 1.0 is infinite
            action, _, _, after = self.model.step(obs, noise, state)
        else:
            action, after = self.model.mode(obs, state)
        outputs = self._parts(action)
        if self.recurrent:
            outputs.append(after)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _parts(self, action: torch.Tensor) -> list[torch.Tensor]:
        """The policy's actions [B, *act] -> each part as the env takes it (``envs.spaces.env_actions``)."""
        if self.action.kind in ("discrete", "box"):
            return [self._clip(action, 0) if self.action.kind == "box" else action]
        batch = action.shape[0]
        parts = []
        for i, (first, size, shape, dtype, box) in enumerate(self.parts):
            part = action[:, first:first + size].reshape(batch, *shape)
            parts.append(self._clip(part.float(), i) if box else part.to(dtype))
        return parts

    def _clip(self, action: torch.Tensor, i: int) -> torch.Tensor:
        return torch.minimum(torch.maximum(action, getattr(self, f"low_{i}")), getattr(self, f"high_{i}"))

    def example(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Inputs of ``batch`` rows to trace with: valid observations (zeros; a mask that allows everything)."""
        found = []
        for (_, shape, dtype), (path, _) in zip(self.inputs(), self.observation.leaf_specs()):
            fill = 1 if path and path == self.observation.mask else 0
            found.append(torch.full((batch, *shape[1:]), fill, dtype=_torch_dtype(dtype)))
        if self.recurrent:
            found.append(torch.zeros((batch, self.model.state_size)))
        if self.sample:
            found.append(torch.full((batch, self.model.noise_width), 0.5))
        return tuple(found)


def _keep_inputs(path: Path, module: ExportedPolicy) -> None:
    """Give the ONNX graph at ``path`` every input of the card, in its order: the exporter drops the inputs the
    graph does not read (a ``global_state`` leaf that only the critic reads), and a caller feeds what the card
    lists."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path))
    present = {value.name: value for value in model.graph.input}
    if len(present) == len(module.inputs()):
        return
    ordered = [present.get(name) or helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape)) for name, shape, dtype in module.inputs()]
    del model.graph.input[:]
    model.graph.input.extend(ordered)
    onnx.save(model, str(path))


_CHECKED = """import torch
from typing import Tuple


class Checked(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, {arguments}) -> {returns}:
{checks}
        return self.inner({names})
"""


def _checked(traced: torch.jit.ScriptModule, module: ExportedPolicy) -> torch.jit.ScriptModule:
    """``traced`` behind a scripted ``forward`` that takes the inputs by their names (``obs.v`` as ``obs_v``) and
    raises a RuntimeError naming the input where one's dtype, rank or size differs from the card's: a trace alone
    would convert a float64 observation to float32 without a word."""
    import importlib.util
    import re
    import tempfile

    names = [re.sub(r"\W", "_", name) for name, _, _ in module.inputs()]
    checks = []
    for (name, shape, dtype), arg in zip(module.inputs(), names):
        expected = _torch_dtype(dtype)
        checks.append(f"        if {arg}.dtype != {expected}:\n            raise RuntimeError("
                      f"'input {name}: expected dtype {dtype} (the card\\'s), got another')")
        sizes = ", ".join(str(n) for n in shape[1:])
        checks.append(f"        if {arg}.dim() != {len(shape)} or {arg}.shape[1:] != [{sizes}]:\n            raise "
                      f"RuntimeError('input {name}: shape ' + str({arg}.shape) + ', expected [batch, {sizes}]')")
    count = len(module.outputs())
    returns = "torch.Tensor" if count == 1 else f"Tuple[{', '.join(['torch.Tensor'] * count)}]"
    source = _CHECKED.format(arguments=", ".join(f"{arg}: torch.Tensor" for arg in names), returns=returns,
                             checks="\n".join(checks), names=", ".join(names))
    # TorchScript compiles a class from its source file: write one, import it, script it
    with tempfile.TemporaryDirectory(prefix="lockstep-export-") as tmp:
        path = Path(tmp) / "lockstep_exported.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("lockstep_exported", path)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return torch.jit.script(loaded.Checked(traced))


@dataclass
class Loaded:
    """One policy of a run, ready to export."""

    name: str  # its name in the run (``shared`` for a run of one policy)
    model: Policy
    normalize: ObsNormalizer
    observation: SpaceSpec
    action: SpaceSpec
    version: int | None  # the policy version of the checkpoint
    channels_last: frozenset[str] = frozenset()  # leaves the env gives as (H, W, C) images (``envs.images``)


def load_policies(run_dir: Path, checkpoint: str | None = None) -> tuple[list[Loaded], dict[str, Any]]:
    """Every policy of ``run_dir``'s checkpoint (``checkpoint``: final, best or a file; default final) and what the
    card says about where they came from. An ``EvalError`` that names what is missing."""
    from lockstep.learner import checkpoint as checkpoint_lib

    config = load_config(run_dir)
    env_id = config.env.id
    try:
        path = checkpoint_lib.find(RunDir(run_dir).checkpoints, checkpoint or checkpoint_lib.FINAL)
    except FileNotFoundError as err:
        raise EvalError(f"{err}; pass --checkpoint FILE to use another" if checkpoint is None else str(err)) from err
    trainer = checkpoint_lib.load(path)["trainer"]
    device = torch.device("cpu")
    channels_last: frozenset[str] = frozenset()
    if parallel_module(env_id) is not None:
        slots = make_slots(env_id, config.vector_kwargs(), False)
        try:
            observation, action = slot_specs(slots, config.env)
            specs = _policy_specs(slots, config, observation, action)
        finally:
            slots.close()
    else:
        env = make(env_id, False, config.vector_kwargs())
        try:
            specs = {SHARED_POLICY: env_specs(env, config.env)}
            routes = _channels_first_routes(env)
            channels_last = frozenset(path for path, leaf in specs[SHARED_POLICY][0].leaf_specs()
                                      if leaf.route in routes)
        finally:
            env.close()
    stored = trainer.get("policies") or {SHARED_POLICY: trainer}
    if sorted(stored) != sorted(specs):
        raise EvalError(f"{path} holds the policies {sorted(stored)}, the run's config {sorted(specs)}")
    from lockstep.learner.team import policy_config

    loaded = []
    for name, (observation, action) in specs.items():
        mean, var = stored_moments(stored[name].get("obs_rms"))
        policy_cfg = policy_config(config, name) if name != SHARED_POLICY else config
        try:
            model, normalize = load_policy(policy_cfg, observation, action, stored[name]["model"], mean, var, device,
                                           f"{path}" + ("" if name == SHARED_POLICY else f" (policy {name})"))
        except PolicyMismatch as err:
            raise EvalError(str(err)) from err
        version = stored[name].get("version", trainer.get("version"))
        loaded.append(Loaded(name, model, normalize, observation, action, None if version is None else int(version),
                             channels_last))
    source = {"run_dir": str(run_dir), "checkpoint": str(path), "iteration": int(trainer["iteration"]),
              "env_id": env_id, "env_kwargs": config.env.kwargs, "env_image_layout": config.env.image_layout,
              "env_obs_keys": list(config.env.obs_keys), "action_mask_key": config.env.action_mask_key}
    return loaded, source


def _channels_first_routes(env) -> frozenset:
    """The routes of the leaves ``envs.images.ChannelsFirst`` transposes among ``env``'s wrappers; none without one."""
    from lockstep.envs.images import ChannelsFirst

    while isinstance(env, gym.Wrapper):
        if isinstance(env, ChannelsFirst):
            return env.routes
        env = env.env
    return frozenset()


def _policy_specs(slots, config, observation: SpaceSpec, action: SpaceSpec) -> dict[str, tuple[SpaceSpec, SpaceSpec]]:
    """A parallel env's policies and each one's spaces: one shared policy, or each policy's own view."""
    if not slots.policy_of:
        return {SHARED_POLICY: (observation, action)}
    from lockstep.envs import EnvSpec
    from lockstep.learner.team import PolicyView

    spec = EnvSpec(config.env.id, observation, action, agents=len(slots.agents), policy_of=slots.policy_of,
                   agent_names=tuple(slots.agents))
    views = {name: PolicyView(spec, name, config.env.action_mask_key) for name in spec.policies}
    return {name: (view.observation, view.action) for name, view in views.items()}


def export_policy(policy: Loaded, fmt: str, out: Path, sample: bool = False) -> ExportedPolicy:
    """Write ``policy`` as ``fmt`` (onnx or torchscript) to ``out``; the module it traced."""
    module = ExportedPolicy(policy.model, policy.normalize, policy.observation, policy.action, sample,
                            policy.channels_last)
    example = module.example()
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        # the tracer's notes on Python values it fixes (the network's shapes, which are fixed) and the exporter's
        # deprecation notice say nothing about this module
        warnings.simplefilter("ignore")
        if fmt == "onnx":
            names = [name for name, _, _ in module.inputs()]
            outputs = [name for name, _, _ in module.outputs()]
            torch.onnx.export(module, example, str(out), input_names=names, output_names=outputs, opset_version=OPSET,
                              dynamo=False, dynamic_axes={name: {0: BATCH} for name in names + outputs})
            _keep_inputs(out, module)
        elif fmt == "torchscript":
            torch.jit.save(_checked(torch.jit.trace(module, example, check_trace=False), module), str(out))
        else:
            raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return module


def card(module: ExportedPolicy, policy: Loaded, fmt: str, source: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The JSON card beside an exported file (docs/deploy.md)."""
    try:
        version = metadata.version("lockstep")
    except metadata.PackageNotFoundError:
        version = None

    def tensors(entries: list[tuple[str, tuple, str]]) -> list[dict[str, Any]]:
        return [{"name": name, "shape": list(shape), "dtype": dtype} for name, shape, dtype in entries]

    return {
        "format": fmt, "lockstep_version": version, "policy": policy.name, "policy_version": policy.version,
        **source, "observation_space": policy.observation.describe(), "action_space": policy.action.describe(),
        "action_mask": policy.observation.mask and _name("obs", policy.observation.mask),
        "channels_last": [_name("obs", path) for path, _ in policy.observation.leaf_specs()
                          if path in policy.channels_last],
        "recurrent": module.recurrent, "sample": module.sample,
        "noise_width": policy.model.noise_width if module.sample else None,
        "inputs": tensors(module.inputs()), "outputs": tensors(module.outputs()),
        "return_at_export": _returns(run_dir, policy.name),
    }


def _returns(run_dir: Path, policy: str) -> dict[str, Any]:
    """The returns the run recorded: training's last 100 episodes (summary.json), the best evaluation while
    training, and ``lockstep eval``'s (eval.json), where present."""
    found: dict[str, Any] = {}
    summary_path, eval_path = run_dir / "summary.json", run_dir / "eval.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        found["training_mean"] = summary.get("episode_return_mean")
        best = (summary.get("evaluation") or {}).get("best")
        if best:
            found["best_evaluation"] = {"return_mean": best.get("return_mean"), "iteration": best.get("iteration")}
    if eval_path.is_file():
        report = json.loads(eval_path.read_text())
        mean = ((report.get("policies") or {}).get(policy) or {}).get("mean", report.get("return_mean"))
        found["eval"] = {"return_mean": mean, "episodes": len(report.get("episodes", [])),
                         "deterministic": report.get("deterministic"), "checkpoint": report.get("checkpoint")}
    return found


def export(run_dir: Path, fmt: str, out: Path, checkpoint: str | None = None, policy: str | None = None,
           sample: bool = False) -> list[Path]:
    """Export the run's policy (``policy``: one of several; all of them into the folder ``out``) to ``out``, each
    with its card (``FILE.json``); the files written."""
    if fmt not in FORMATS:
        raise EvalError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401  (the graph's inputs are completed with it: ``_keep_inputs``)
        except ImportError:
            raise EvalError("--format onnx needs the onnx package: pip install -e '.[export]'") from None
    loaded, source = load_policies(run_dir, checkpoint)
    names = [p.name for p in loaded]
    if policy is not None:
        if policy not in names:
            raise EvalError(f"--policy {policy!r}: the run's policies are {', '.join(names)}")
        loaded = [p for p in loaded if p.name == policy]
    folder = out.is_dir() or not out.suffix
    if len(loaded) > 1 and not folder:
        raise EvalError(f"the run has {len(loaded)} policies ({', '.join(names)}): pass --policy NAME for one file, "
                        f"or a folder as --out for one file each")
    written = []
    for p in loaded:
        target = out / f"{p.name}{SUFFIX[fmt]}" if folder else out
        module = export_policy(p, fmt, target, sample)
        atomic_write(Path(f"{target}.json"), json.dumps(card(module, p, fmt, source, run_dir), indent=2) + "\n")
        written.append(target)
    return written


def main(run_dir: Path, *, fmt: str, out: str, checkpoint: str | None = None, policy: str | None = None,
         sample: bool = False) -> int:
    """``lockstep export``: write the files, print where; the exit code."""
    try:
        written = export(run_dir, fmt, Path(out), checkpoint, policy, sample)
    except EvalError as err:
        print(f"lockstep: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path} and its card {path}.json")
    return 0

