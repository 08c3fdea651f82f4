"""The audit trail: every training batch and every policy version, so anyone can recompute
the behaviour log-probs and confirm that a batch is on-policy (``lockstep audit RUN_DIR``).

Format (also written to ``audit/README.md``):
    policy_vNNNNNN.pt   torch.save of {"version", "model" (state dict), "obs_mean", "obs_var"}
                        for policy version N (obs_* are None without observation normalization)
    batch_NNNNNN.npz    iteration N's training batch: obs [T, N, *obs], actions [T, N, *act],
                        logprobs [T, N], versions [T, N] (the version that produced each action),
                        lengths [N] (steps of each slot; a slot cut short by the phase cut-off
                        has fewer than T, and its rows past that hold no sample),
                        trained_by (the version the update started from), strategy (the sync name)
"""

from __future__ import annotations

import contextlib

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lockstep.config import Config, load as load_config, save as save_config
from lockstep.envs import EnvSpec, env_spec
from lockstep.models import ActorCritic, ObsNormalizer
from lockstep.rollout import Batch

README = __doc__.split("\n\n", 1)[1].replace("Format (also written to ``audit/README.md``):\n", "")


class AuditWriter:
    """Writes the audit trail; each file atomically (a temporary file, then a rename)."""

    def __init__(self, directory: Path, config: Config, fresh: bool = True) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        if fresh:  # a new run in a reused directory must not be audited with an older run's files
            for old in [*directory.glob("batch_*.npz"), *directory.glob("policy_v*.pt")]:
                old.unlink()
        (directory / "README.md").write_text(
            "# audit\n\nWritten by `lockstep train --audit`; checked by `lockstep audit RUN_DIR`.\n\n```\n"
            + README.strip("\n") + "\n```\n"
        )
        save_config(config, directory / "config.yaml")

    def policy(self, version: int, state_dict: dict, obs_mean: np.ndarray | None, obs_var: np.ndarray | None) -> None:
        state = {k: v.detach().cpu().clone() for k, v in state_dict.items()}
        with self._atomic(f"policy_v{version:06d}.pt") as f:
            torch.save({"version": version, "model": state, "obs_mean": obs_mean, "obs_var": obs_var}, f)

    def batch(self, iteration: int, trained_by: int, strategy: str, batch: Batch) -> None:
        with self._atomic(f"batch_{iteration:06d}.npz") as f:
            np.savez_compressed(
                f, obs=batch.obs, actions=batch.actions, logprobs=batch.logprobs, versions=batch.versions,
                lengths=batch.lengths, trained_by=np.int64(trained_by), strategy=np.str_(strategy),
            )

    @contextlib.contextmanager
    def _atomic(self, name: str):
        target = self.directory / name
        tmp = target.with_name(name + ".tmp")
        with tmp.open("wb") as f:
            yield f
        tmp.replace(target)


# -- checking (``lockstep audit RUN_DIR``) ------------------------------------------------


class AuditError(RuntimeError):
    """The run directory holds no audit trail that can be checked."""


@dataclass
class IterationAudit:
    """What recomputing one iteration's behaviour log-probs found."""

    iteration: int
    trained_by: int = -1
    strategy: str = ""
    samples: int = 0
    versions: list[int] = field(default_factory=list)  # distinct version stamps, ascending
    lag_max: int = 0  # trained_by - min(versions)
    off_version: int = 0  # samples whose stamp is not trained_by
    differing: int = 0  # |recomputed - stored| > tolerance, or no policy file to recompute with
    max_abs_diff: float = 0.0  # over the samples that could be recomputed
    missing: dict[int, int] = field(default_factory=dict)  # version without a policy file -> its samples
    problems: list[str] = field(default_factory=list)  # unreadable or inconsistent files

    @property
    def strict(self) -> bool:
        return self.strategy == "strict"

    @property
    def clean(self) -> bool:
        return not (self.differing or self.missing or self.problems or (self.strict and self.off_version))

    @property
    def failed(self) -> bool:
        """A failure of the audit. Strict: any blemish. Pipelined serves frozen snapshots too, so a
        log-prob that does not recompute is a failure there, but lag is allowed. Reference strategies
        update parameters in place: differences are expected and reported, never a failure."""
        if self.strict:
            return not self.clean
        if self.strategy == "pipelined":
            return bool(self.differing or self.missing or self.problems)
        return False


@dataclass
class AuditReport:
    run_dir: Path
    tolerance: float
    iterations: list[IterationAudit]

    @property
    def strategies(self) -> list[str]:
        return sorted({it.strategy for it in self.iterations})

    @property
    def samples(self) -> int:
        return sum(it.samples for it in self.iterations)

    @property
    def differing(self) -> int:
        return sum(it.differing for it in self.iterations)

    @property
    def off_version(self) -> int:
        return sum(it.off_version for it in self.iterations)

    @property
    def failed(self) -> bool:
        return any(it.failed for it in self.iterations)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def iteration(self, number: int) -> IterationAudit:
        return next(it for it in self.iterations if it.iteration == number)


def _load_policy(path: Path) -> dict:
    """torch.load without running arbitrary pickles: tensors, plain containers and numpy arrays only."""
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype]
    allowed += [getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith("DType")]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location="cpu", weights_only=True)


class _Policies:
    """Policy files of one run, loaded on first use, as (model, normalizer) or the reason there is none."""

    def __init__(self, directory: Path, config: Config, spec: EnvSpec) -> None:
        self.directory, self.config, self.spec = directory, config, spec
        self._cache: dict[int, tuple[ActorCritic, ObsNormalizer] | str] = {}

    def get(self, version: int) -> tuple[ActorCritic, ObsNormalizer] | str:
        if version not in self._cache:
            self._cache[version] = self._load(version)
        return self._cache[version]

    def keep_only(self, versions: set[int]) -> None:
        for v in [v for v in self._cache if v not in versions]:
            del self._cache[v]

    def _load(self, version: int) -> tuple[ActorCritic, ObsNormalizer] | str:
        if version < 0:
            return "missing"  # a stamp that no version could have written
        path = self.directory / f"policy_v{version:06d}.pt"
        if not path.is_file():
            return "missing"
        try:
            state = _load_policy(path)
        except Exception as err:  # noqa: BLE001 - reported, not raised
            return f"{path.name} is unreadable: {err}"
        if state.get("version") != version:
            return f"{path.name} says it holds version {state.get('version')}"
        m = self.config.model
        model = ActorCritic(self.spec.observation, self.spec.action, m.hidden, m.activation, m.init_log_std)
        try:
            model.load_state_dict(state["model"])
        except (KeyError, RuntimeError) as err:
            return f"{path.name} does not fit the configured model: {err}"
        model.eval().requires_grad_(False)
        normalizer = ObsNormalizer(state.get("obs_mean"), state.get("obs_var"), self.config.env.clip_obs,
                                   torch.device("cpu"))
        return model, normalizer


def _check_batch(path: Path, iteration: int, policies: _Policies, spec: EnvSpec, tolerance: float) -> IterationAudit:
    # until the file says otherwise (an unreadable file never does), the strategy the run was configured with
    result = IterationAudit(iteration, strategy=policies.config.sync.strategy)
    try:
        with np.load(path, allow_pickle=False) as data:
            obs, actions = data["obs"], data["actions"]
            stored, stamps = data["logprobs"], data["versions"]
            lengths = data["lengths"] if "lengths" in data.files else np.full(stored.shape[-1], stored.shape[0])
            result.trained_by, result.strategy = int(data["trained_by"]), str(data["strategy"])
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file is a finding, not a crash
        result.problems.append(f"{path.name} is unreadable: {err}")
        return result
    act_shape = () if spec.action.kind == "discrete" else tuple(spec.action.shape)
    TN = stored.shape
    if (len(TN) != 2 or stamps.shape != TN or obs.shape != TN + tuple(spec.observation.shape)
            or actions.shape != TN + act_shape):
        result.problems.append(
            f"{path.name} has inconsistent shapes: obs {obs.shape}, actions {actions.shape}, logprobs {stored.shape}, "
            f"versions {stamps.shape} (observation {spec.observation.shape}, action {act_shape})")
        return result
    valid = np.arange(TN[0])[:, None] < lengths[None, :]  # steps past an unroll cut short hold no sample
    obs, actions, stored, stamps = obs[valid], actions[valid], stored[valid], stamps[valid]
    result.samples = int(stored.size)
    versions = np.unique(stamps)
    result.versions = [int(v) for v in versions]
    if result.samples:
        result.lag_max = result.trained_by - int(versions.min())
    result.off_version = int(np.count_nonzero(stamps != result.trained_by))
    action_dtype = torch.int64 if spec.action.kind == "discrete" else torch.float32
    for v in result.versions:
        rows = stamps == v
        policy = policies.get(v)
        if isinstance(policy, str):
            count = int(rows.sum())
            result.differing += count
            if policy == "missing":
                result.missing[v] = count
            else:
                result.problems.append(policy)
            continue
        model, normalize = policy
        with torch.inference_mode():
            x = normalize(torch.as_tensor(obs[rows]))
            a = torch.as_tensor(actions[rows], dtype=action_dtype)
            recomputed = model.evaluate(x, a)[0].numpy()
        want = stored[rows]
        diff = np.abs(recomputed.astype(np.float64) - want.astype(np.float64))
        diff[recomputed == want] = 0.0  # equal infinities
        diff[np.isnan(diff)] = np.inf
        result.differing += int(np.count_nonzero(diff > tolerance))
        result.max_abs_diff = max(result.max_abs_diff, float(diff.max(initial=0.0)))
    policies.keep_only(set(result.versions))
    return result


def check(run_dir: Path, tolerance: float = 1e-5) -> AuditReport:
    """Recompute the behaviour log-prob of every recorded sample with the policy version stamped on it.

    Raises ``AuditError`` when ``run_dir`` has no audit trail (or no readable config in it).
    """
    run_dir = Path(run_dir)
    directory = run_dir / "audit"
    if not directory.is_dir():
        raise AuditError(f"{run_dir} has no audit/ directory: run with lockstep train --audit")
    try:
        config = load_config(directory / "config.yaml")
    except Exception as err:  # noqa: BLE001
        raise AuditError(f"cannot read {directory / 'config.yaml'}: {err}") from err
    spec = env_spec(config.env.id)
    policies = _Policies(directory, config, spec)
    batches = []
    for path in directory.glob("batch_*.npz"):
        number = path.stem.removeprefix("batch_")
        if number.isdigit():
            batches.append((int(number), path))
    results = [_check_batch(path, n, policies, spec, tolerance) for n, path in sorted(batches)]
    return AuditReport(run_dir, tolerance, results)


# -- the report ------------------------------------------------------------------------------

_LONG = 40  # longer runs print only the iterations with findings


def _versions_text(versions: list[int]) -> str:
    if len(versions) <= 4:
        return ",".join(map(str, versions)) or "-"
    return f"{versions[0]}..{versions[-1]} ({len(versions)})"


def _notes(it: IterationAudit) -> str:
    notes = [f"no policy_v{v:06d}.pt for version {v} ({n} samples)" for v, n in it.missing.items()]
    notes += it.problems
    if it.strict and it.off_version:
        notes.append(f"{it.off_version} samples not produced by version {it.trained_by}")
    return "; ".join(notes)


def format_report(report: AuditReport) -> str:
    header = ("iter", "trained_by", "strategy", "samples", "versions", "lag_max", "differing", "max|diff|", "notes")
    shown = report.iterations if len(report.iterations) <= _LONG else [it for it in report.iterations if not it.clean]
    rows = [header] + [
        (str(it.iteration), str(it.trained_by), it.strategy, str(it.samples), _versions_text(it.versions),
         str(it.lag_max), str(it.differing), f"{it.max_abs_diff:.2e}", _notes(it))
        for it in shown
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = [f"audit of {report.run_dir} (tolerance {report.tolerance:g})"]
    for r in rows:
        lines.append("  ".join(c.rjust(w) if i not in (2, 4) else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths))) + ("  " + r[-1] if r[-1] else ""))
    hidden = len(report.iterations) - len(shown)
    if hidden:
        lines.append(f"... and {hidden} clean iteration(s) not shown")
    lines.append(f"{len(report.iterations)} iteration(s) checked, {report.samples} samples, "
                 f"{report.differing} differing, {report.off_version} not produced by the version that trained on them")
    lines.append(_verdict(report))
    return "\n".join(lines)


def _verdict(report: AuditReport) -> str:
    if not report.iterations:
        return "NOTHING CHECKED: audit/ holds no training batch (the run ended before its first iteration)"
    strict = [it for it in report.iterations if it.strict]
    other = [it for it in report.iterations if not it.strict]
    parts = []
    if strict:
        bad = [it for it in strict if it.failed]
        if bad:
            parts.append(f"FAIL: {len(bad)} of {len(strict)} strict iteration(s) are not on-policy "
                         f"(iterations {', '.join(str(it.iteration) for it in bad[:10])}"
                         f"{', ...' if len(bad) > 10 else ''})")
        else:
            parts.append(f"OK: all {len(strict)} strict iteration(s) are on-policy: every stored log-prob was "
                         f"recomputed within {report.tolerance:g} by the version that trained on it")
    if other:
        differing = sum(it.differing for it in other)
        names = ", ".join(sorted({it.strategy for it in other}))
        parts.append(f"NOTE: {differing} differing sample(s) in {len(other)} iteration(s) trained with {names}, "
                     "not a failure: the audit fails only strict runs (pipelined samples may lag, and the in-place "
                     "reference strategies are expected to differ)")
    return " | ".join(parts)


def main(run_dir: str, tolerance: float = 1e-5) -> int:
    """``lockstep audit RUN_DIR``: print the report; 0 when clean, 1 when a strict run is not on-policy,
    2 when there is nothing to audit."""
    try:
        report = check(Path(run_dir), tolerance)
    except AuditError as err:
        print(f"lockstep audit: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    return report.exit_code
