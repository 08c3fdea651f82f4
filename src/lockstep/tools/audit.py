"""Checking the audit trail (``lockstep audit RUN_DIR``): recompute every behaviour log-prob from the
policy version that produced it, and judge each batch by its synchronization strategy's rules.

The tolerance. Inference and the audit compute a log-prob in float32 at different batch sizes (and inference
perhaps in numpy), so the two round differently. A sample recomputes when |recomputed - stored| <= tolerance
+ RELATIVE x M, where M is the magnitude of the log-prob's terms (``Policy.audit_step``: twice the largest
logit of a Categorical; for a Gaussian dimension (|a| + |mu|) |u| / sigma + u^2 / 2 + |log sigma| + 1) and
RELATIVE is 32 units of float32's epsilon: the same log-prob at batch 1 and 4,096, or in numpy and torch,
differed by up to ~6 of them. A changed sample still fails: 1e-3 is far past the bound unless a Gaussian's
sigma is tiny beside its means, where float32 itself cannot tell such samples apart.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lockstep import sync
from lockstep.algo.normalize import ObsNormalizer, as_tensors
from lockstep.config import Config
from lockstep.config import load as load_config
from lockstep.envs import EnvSpec, env_spec
from lockstep.envs.spaces import ACTIVE_LEAF
from lockstep.learner import checkpoint, team
from lockstep.models import Policy, build_policy
from lockstep.models.load import PolicyMismatch, load_policy
from lockstep.observe.metrics import add_counts
from lockstep.observe.run_dir import RunDir

RELATIVE = 32 * float(np.finfo(np.float32).eps)  # of the terms' magnitude (module docstring): 3.8e-6


class AuditError(RuntimeError):
    """The run directory holds no audit trail that can be checked."""


@dataclass
class IterationAudit:
    """What recomputing one iteration's behaviour log-probs found, and the rules it is judged by.

    The rules come from the synchronization registry (``lockstep.sync.recorded``): ``max_lag``
    bounds trained_by - version for every sample (0 for strict, K for pipelined, None: unbounded),
    and ``snapshots`` says whether samples were produced by immutable versions (strict, pipelined)
    or by a model updated in place (the reference designs that ``lockstep bench sync`` runs).
    """

    iteration: int
    trained_by: int = -1
    strategy: str = ""
    max_lag: int | None = 0  # the strategy's bound on trained_by - version; None: unbounded
    snapshots: bool = True  # served by immutable versions, so every sample must recompute exactly
    samples: int = 0
    inactive: int = 0  # of ``samples``: steps of a multi-agent env's slot whose agent had left (never trained on)
    versions: list[int] = field(default_factory=list)  # distinct version stamps, ascending
    lag_max: int = 0  # trained_by - min(versions)
    off_version: int = 0  # samples whose stamp is not trained_by
    newer: int = 0  # samples stamped with a version after trained_by: no strategy can produce them
    over_lag: int = 0  # samples with trained_by - stamp > max_lag
    lag_counts: list[int] = field(default_factory=list)  # samples of each lag 0, 1, ... (a newer stamp: none)
    differing: int = 0  # |recomputed - stored| > tolerance, or no policy file to recompute with
    mismatched: int = 0  # the part of ``differing`` that was recomputed: |recomputed - stored| > tolerance
    max_abs_diff: float = 0.0  # over the samples that could be recomputed
    missing: dict[int, int] = field(default_factory=dict)  # version without a policy file -> its samples
    problems: list[str] = field(default_factory=list)  # unreadable or inconsistent files, unknown strategy
    # the recorded states that values were bootstrapped from (a recurrent policy's), recomputed like the log-probs
    states: int = 0  # recomputed
    states_mismatched: int = 0  # of ``states``: some |recomputed - stored| > tolerance + RELATIVE x (1 + |stored|)

    @property
    def lag_violations(self) -> int:
        """Samples whose lag is outside [0, max_lag]."""
        return self.newer + self.over_lag

    @property
    def failures(self) -> list[str]:
        """Why this iteration fails the audit; empty when it passes.

        Every strategy fails on a trail that cannot be checked (an unreadable or inconsistent file,
        an unknown strategy, a stamped version without its policy file: one is written at every
        publish) and on a sample stamped with a version newer than the one that trained it.
        Snapshot strategies (strict, pipelined) also fail on a sample whose log-prob the stamped
        version does not recompute within the tolerance, or whose lag exceeds ``max_lag``.
        In-place (reference) strategies do not: a forward pass on a model that the trainer updates
        in place is not tied to one version, so their differences and their (unbounded) lag are
        what they are measured on (``lockstep bench sync``), reported here and never a failure.
        """
        found = list(self.problems)
        found += [f"no policy_v{v:06d}.pt for version {v} ({n} samples)" for v, n in self.missing.items()]
        if self.newer:
            found.append(f"{self.newer} sample(s) stamped with a version newer than {self.trained_by}, "
                         "the version that trained them")
        if self.snapshots and self.mismatched:
            found.append(f"{self.mismatched} sample(s) whose log-prob the version stamped on them does not "
                         f"recompute (max |diff| {self.max_abs_diff:.2e})")
        if self.snapshots and self.states_mismatched:
            found.append(f"{self.states_mismatched} of {self.states} bootstrapped state(s) that the versions "
                         "stamped on their slots' steps do not recompute")
        if self.over_lag and self.max_lag == 0:
            found.append(f"{self.over_lag} sample(s) not produced by version {self.trained_by}, the version that "
                         f"trained them ({self.strategy} allows no lag)")
        elif self.over_lag:
            found.append(f"{self.over_lag} sample(s) lag the version that trained them by more than max_lag "
                         f"{self.max_lag} (lag up to {self.lag_max})")
        return found

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def clean(self) -> bool:
        """Nothing to show: a pass without a single differing sample."""
        return not self.failures and not self.differing


@dataclass
class AuditReport:
    """The findings of ``check``: one ``IterationAudit`` per training batch, in iteration order."""

    run_dir: Path
    tolerance: float
    iterations: list[IterationAudit]
    opponent_moves: int = 0  # self-play: moves the learner played for opponents (summary.json); never recorded

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
    def inactive(self) -> int:
        return sum(it.inactive for it in self.iterations)

    @property
    def states(self) -> int:
        """Bootstrapped states recomputed (a recurrent policy's: each slot's last step, each truncation)."""
        return sum(it.states for it in self.iterations)

    @property
    def off_version(self) -> int:
        return sum(it.off_version for it in self.iterations)

    @property
    def lag_counts(self) -> list[int]:
        """The samples of each lag 0, 1, ... over every iteration: the lag's distribution."""
        total = np.zeros(0, np.int64)
        for it in self.iterations:
            total = add_counts(total, np.asarray(it.lag_counts, np.int64))
        return total.tolist()

    @property
    def failed(self) -> bool:
        return any(it.failed for it in self.iterations)

    @property
    def exit_code(self) -> int:
        """0: PASS; 1: FAIL; 2: nothing checked (no training batch in the trail)."""
        if not self.iterations:
            return 2
        return 1 if self.failed else 0

    @property
    def verdict(self) -> str:
        """One line that says PASS, FAIL or NOTHING CHECKED, and why; it agrees with ``exit_code``."""
        if not self.iterations:
            return "NOTHING CHECKED: audit/ holds no training batch (the run ended before its first iteration)"
        n = len(self.iterations)
        bad = [it for it in self.iterations if it.failed]
        if bad:
            listed = ", ".join(str(it.iteration) for it in bad[:10]) + (", ..." if len(bad) > 10 else "")
            return (f"FAIL: {len(bad)} of {n} iteration(s) failed the audit (iterations {listed}); "
                    f"iteration {bad[0].iteration}: {'; '.join(bad[0].failures)}")
        parts = []
        for name in dict.fromkeys(it.strategy for it in self.iterations):  # in order of first use
            group = [it for it in self.iterations if it.strategy == name]
            first = group[0]
            if first.snapshots:
                lag = ("every sample produced by the version that trained on it" if first.max_lag == 0
                       else f"every sample within lag {first.max_lag} of the version that trained on it")
                parts.append(f"{name}: {lag}, every log-prob recomputed within {self.tolerance:g} (and float32's "
                             "rounding of its terms) by the version stamped on it")
            else:
                differing = sum(it.differing for it in group)
                lag_max = max(it.lag_max for it in group)
                parts.append(f"{name} updates the policy in place: {differing} differing sample(s) and lag up to "
                             f"{lag_max} reported, not failures")
        return f"PASS: {n} iteration(s), {self.samples} samples; " + "; ".join(parts)

    def iteration(self, number: int) -> IterationAudit:
        return next(it for it in self.iterations if it.iteration == number)


class _Policies:
    """Policy files of one run, loaded on first use, as (model, normalizer) or the reason there is none."""

    def __init__(self, directory: Path, config: Config, spec: EnvSpec) -> None:
        self.directory, self.config, self.spec = directory, config, spec
        self.state_size = build_policy(spec.observation, spec.action, config.model).state_size  # [N, S] per batch
        self._cache: dict[int, tuple[Policy, ObsNormalizer] | str] = {}

    def get(self, version: int) -> tuple[Policy, ObsNormalizer] | str:
        if version not in self._cache:
            self._cache[version] = self._load(version)
        return self._cache[version]

    def keep_only(self, versions: set[int]) -> None:
        for v in [v for v in self._cache if v not in versions]:
            del self._cache[v]

    def _load(self, version: int) -> tuple[Policy, ObsNormalizer] | str:
        if version < 0:
            return "missing"  # a stamp that no version could have written
        path = self.directory / f"policy_v{version:06d}.pt"
        if not path.is_file():
            return "missing"
        try:
            state = checkpoint.load(path)  # tensors, plain containers and numpy arrays only
        except Exception as err:  # reported, not raised
            return f"{path.name} is unreadable: {err}"
        if state.get("version") != version:
            return f"{path.name} says it holds version {state.get('version')}"
        if "model" not in state:
            return f"{path.name} holds no model parameters"
        try:
            return load_policy(self.config, self.spec.observation, self.spec.action, state["model"],
                               state.get("obs_mean"), state.get("obs_var"), torch.device("cpu"), path.name)
        except PolicyMismatch as err:
            return str(err)


def _check_batch(path: Path, iteration: int, policies: _Policies, spec: EnvSpec, tolerance: float) -> IterationAudit:
    # until the file says otherwise (an unreadable file never does), the strategy the run was configured with
    configured = policies.config.sync
    result = IterationAudit(iteration, strategy=configured.strategy)
    max_lag = configured.max_lag
    try:
        with np.load(path, allow_pickle=False) as data:
            obs, actions = _observations(data, spec), data["actions"]
            stored, stamps = data["logprobs"], data["versions"]
            lengths = data["lengths"] if "lengths" in data.files else np.full(stored.shape[-1], stored.shape[0])
            # a feedforward policy's batches hold no states: its state is [N, 0] and nothing resets
            N = stored.shape[-1]
            initial_state = data["initial_state"] if "initial_state" in data.files else np.zeros((N, 0), np.float32)
            starts = data["starts"] if "starts" in data.files else np.zeros(stored.shape, bool)
            # where values were bootstrapped: (steps, slots) and the states inference left there
            bootstrapped = None
            if "bootstrap_state" in data.files:
                bootstrapped = (np.concatenate([lengths - 1, data["final_t"]]),
                                np.concatenate([np.arange(N), data["final_n"]]),
                                np.concatenate([data["bootstrap_state"], data["final_state"]]))
            result.trained_by, result.strategy = int(data["trained_by"]), str(data["strategy"])
            if "max_lag" in data.files:  # older trails have only the configured bound
                max_lag = int(data["max_lag"])
    except Exception as err:  # a truncated or foreign file is a finding, not a crash
        result.problems.append(f"{path.name} is unreadable: {err}")
        return result
    try:
        rules = sync.recorded(result.strategy, max_lag)
        result.max_lag, result.snapshots = rules.max_lag, rules.snapshots
    except ValueError as err:  # the samples are still checked, under the strictest rules
        result.problems.append(f"{path.name} names a strategy the audit cannot judge: {err}")
    act_shape = spec.action.element_shape
    TN = stored.shape
    if (len(TN) != 2 or stamps.shape != TN or obs.shape != TN + tuple(spec.observation.shape)
            or actions.shape != TN + act_shape):
        result.problems.append(
            f"{path.name} has inconsistent shapes: obs {obs.shape}, actions {actions.shape}, logprobs {stored.shape}, "
            f"versions {stamps.shape} (observation {spec.observation.shape}, action {act_shape})")
        return result
    valid = np.arange(TN[0])[:, None] < lengths[None, :]  # steps past an unroll cut short hold no sample
    actions = actions.astype(spec.action.action_dtype, copy=False)
    if starts.shape != TN or initial_state.shape != (TN[1], policies.state_size):
        result.problems.append(f"{path.name} lacks the recurrent states (initial_state [N, S] and starts [T, N]) "
                               "a recurrent policy's log-probs are recomputed from")
        return result
    recomputed, magnitude, after = _recompute(obs, actions, stamps, valid, initial_state, starts, policies)
    if bootstrapped is not None:
        _check_states(result, after, *bootstrapped, tolerance)
    recomputed, magnitude = recomputed[valid], magnitude[valid]
    stored, stamps = stored[valid], stamps[valid]
    result.samples = int(stored.size)
    if obs.dtype.names and ACTIVE_LEAF in obs.dtype.names:
        result.inactive = int(np.count_nonzero(obs[ACTIVE_LEAF].reshape(*TN, -1)[..., 0][valid] == 0))
    versions = np.unique(stamps)
    result.versions = [int(v) for v in versions]
    if result.samples:
        result.lag_max = result.trained_by - int(versions.min())
    lag = result.trained_by - stamps.astype(np.int64)
    result.off_version = int(np.count_nonzero(lag != 0))
    result.newer = int(np.count_nonzero(lag < 0))
    result.lag_counts = np.bincount(lag[lag >= 0]).tolist()
    if result.max_lag is not None:
        result.over_lag = int(np.count_nonzero(lag > result.max_lag))
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
        got, want = recomputed[rows], stored[rows]
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        diff[got == want] = 0.0  # equal infinities
        diff[np.isnan(diff)] = np.inf
        mismatched = int(np.count_nonzero(diff > tolerance + RELATIVE * magnitude[rows]))
        result.mismatched += mismatched
        result.differing += mismatched
        result.max_abs_diff = max(result.max_abs_diff, float(diff.max(initial=0.0)))
    policies.keep_only(set(result.versions))
    return result


def _observations(data: np.lib.npyio.NpzFile, spec: EnvSpec) -> np.ndarray:
    """The batch's observations [T, N, *obs]: ``obs``, or for a tree its leaves ``obs/PATH`` as records."""
    if not spec.observation.tree:
        return data["obs"]
    leaves = [data[f"obs/{path}"] for path in spec.observation.paths()]  # a missing leaf: unreadable
    if len({leaf.shape[:2] for leaf in leaves}) != 1 or any(
            leaf.shape[2:] != spec_leaf.shape for leaf, (_, spec_leaf) in zip(leaves, spec.observation.leaves)):
        raise ValueError(f"its observation leaves {[leaf.shape for leaf in leaves]} do not fit "
                         f"{spec.observation.describe()}")
    records = np.empty(leaves[0].shape[:2], spec.observation.array_dtype)
    for path, leaf in zip(spec.observation.paths(), leaves):
        records[path] = leaf
    return records


def _check_states(result: IterationAudit, after: np.ndarray, steps: np.ndarray, slots: np.ndarray,
                  stored: np.ndarray, tolerance: float) -> None:
    """Compare the states stored where values were bootstrapped, [M, S] after step ``steps`` [M] of slot
    ``slots`` [M], with the states the audit recomputed there (``after`` [T, N, S]; NaN: unknown, not judged)."""
    if stored.shape != (len(steps), after.shape[2]) or len(steps) != len(slots) or (
            len(steps) and (steps.min() < 0 or steps.max() >= after.shape[0] or slots.max() >= after.shape[1])):
        result.problems.append(f"its bootstrapped states ({stored.shape}) do not fit its steps and slots")
        return
    recomputed = after[steps, slots]  # [M, S]
    known = ~np.isnan(recomputed).any(axis=1)
    diff = np.abs(recomputed[known] - stored[known])
    result.states += int(known.sum())
    result.states_mismatched += int(np.count_nonzero(
        (diff > tolerance + RELATIVE * (1.0 + np.abs(stored[known]))).any(axis=1)))


def _recompute(obs: np.ndarray, actions: np.ndarray, stamps: np.ndarray, valid: np.ndarray,
               initial_state: np.ndarray, starts: np.ndarray, policies: _Policies
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[T, N] log-probs recomputed step by step as inference computed them, [T, N] the magnitude of their
    terms (module docstring), and [T, N, S] the state after each step: from each slot's stored initial state
    ([N, 0] for a feedforward policy), reset where an episode starts, each step by the version stamped on it.

    NaN where a step cannot be recomputed: its version has no policy (or an unusable one), or an earlier
    step of its slot had none, so the (non-empty) state it was acted with is unknown."""
    T, N = stamps.shape
    state = torch.as_tensor(initial_state, dtype=torch.float32)  # [N, S]
    known = np.ones(N, bool)
    out, magnitude = np.full((T, N), np.nan), np.zeros((T, N))
    states = np.full((T, *state.shape), np.nan, np.float32)  # [T, N, S]
    with torch.inference_mode():
        for t in range(T):
            state = state * torch.as_tensor(~starts[t], dtype=torch.float32)[:, None]
            for v in np.unique(stamps[t][valid[t]]):
                rows = valid[t] & (stamps[t] == v)
                policy = policies.get(int(v))
                if isinstance(policy, str):
                    known[rows] = state.shape[1] == 0  # an empty state is known whatever acted on it
                    continue
                model, normalize = policy
                idx = torch.as_tensor(np.flatnonzero(rows))
                logprob, size, after = model.audit_step(normalize(as_tensors(obs[t, rows], torch.device("cpu"))),
                                                        torch.as_tensor(actions[t, rows]), state[idx])
                state[idx] = after
                out[t, rows & known] = logprob.numpy()[known[rows]]
                magnitude[t, rows] = size.numpy()
            states[t, known] = state.numpy()[known]
    return out, magnitude, states


def check(run_dir: Path, tolerance: float = 1e-5, policy: str | None = None) -> AuditReport:
    """Recompute the behaviour log-prob of every recorded sample with the policy version stamped on it; of
    ``policy``'s samples, for a run of several policies (``policies``: each has its own trail, ``policies_of``).

    Raises ``AuditError`` when ``run_dir`` has no audit trail (or no readable config in it).
    """
    run_dir = Path(run_dir)
    config = _config(run_dir)
    spec = env_spec(config.env.id, config.env.obs_keys, config.env.action_mask_key, config.vector_kwargs())
    directory = run_dir / "audit"
    if spec.policies:
        if policy not in spec.policies:
            raise AuditError(f"{run_dir} trained the policies {list(spec.policies)}: audit each of them")
        directory = team.policy_audit_dir(directory, policy)
        config = team.policy_config(config, policy)
        spec = team.PolicyView(spec, policy, config.env.action_mask_key).spec
    elif policy is not None:
        raise AuditError(f"{run_dir} trained one policy, not {policy!r}")
    policies = _Policies(directory, config, spec)
    batches = []
    for path in directory.glob("batch_*.npz"):
        number = path.stem.removeprefix("batch_")
        if number.isdigit():
            batches.append((int(number), path))
    results = [_check_batch(path, n, policies, spec, tolerance) for n, path in sorted(batches)]
    summary = RunDir(run_dir).summary() or {}
    return AuditReport(run_dir, tolerance, results, int(summary.get("opponent_moves", 0)))


def policies_of(run_dir: Path) -> list[str | None]:
    """The policies whose trails ``check`` audits: each of a run of several, or [None] for one policy."""
    config = _config(Path(run_dir))
    return list(config.policies) or [None]


def _config(run_dir: Path) -> Config:
    directory = run_dir / "audit"
    if not directory.is_dir():
        raise AuditError(f"{run_dir} has no audit/ directory: run with lockstep train --audit")
    try:
        return load_config(directory / "config.yaml")
    except Exception as err:
        raise AuditError(f"cannot read {directory / 'config.yaml'}: {err}") from err


# -- the report ------------------------------------------------------------------------------

_LONG = 40  # longer runs print only the iterations with findings


def _versions_text(versions: list[int]) -> str:
    if len(versions) <= 4:
        return ",".join(map(str, versions)) or "-"
    return f"{versions[0]}..{versions[-1]} ({len(versions)})"


def _notes(it: IterationAudit) -> str:
    notes = it.failures
    if not it.snapshots and it.mismatched:
        notes.append(f"{it.mismatched} differing: expected of in-place updates, not a failure")
    return "; ".join(notes)


def _lag_text(counts: list[int]) -> str:
    """The lag's distribution as a line: each lag's samples and share, and the mean."""
    total = sum(counts)
    shares = ", ".join(f"{lag}: {n} ({n / total:.1%})" for lag, n in enumerate(counts) if n)
    mean = sum(lag * n for lag, n in enumerate(counts)) / total
    return f"lag (versions: samples): {shares}; mean {mean:.3f}"


def format_report(report: AuditReport) -> str:
    """The table of iterations (only those with findings, for long runs), a total and the verdict line."""
    header = ("iter", "trained_by", "strategy", "samples", "versions", "lag_max", "max_lag", "differing", "max|diff|",
              "notes")
    shown = report.iterations if len(report.iterations) <= _LONG else [it for it in report.iterations if not it.clean]
    rows = [header] + [
        (str(it.iteration), str(it.trained_by), it.strategy, str(it.samples), _versions_text(it.versions),
         str(it.lag_max), "-" if it.max_lag is None else str(it.max_lag), str(it.differing),
         f"{it.max_abs_diff:.2e}", _notes(it))
        for it in shown
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = [f"audit of {report.run_dir} (tolerance {report.tolerance:g} + {RELATIVE:.2g} x the magnitude of each "
             "log-prob's terms)"]
    for r in rows:
        cells = [c.rjust(w) if i not in (2, 4) else c.ljust(w)  # strategy and versions are text: left-aligned
                 for i, (c, w) in enumerate(zip(r[:-1], widths, strict=True))]
        lines.append("  ".join(cells) + ("  " + r[-1] if r[-1] else ""))
    hidden = len(report.iterations) - len(shown)
    if hidden:
        lines.append(f"... and {hidden} clean iteration(s) not shown")
    lines.append(f"{len(report.iterations)} iteration(s) checked, {report.samples} samples, "
                 f"{report.differing} differing, {report.off_version} not produced by the version that trained on them")
    if report.off_version:
        lines.append(_lag_text(report.lag_counts))
    if report.opponent_moves:
        lines.append(f"self-play: {report.opponent_moves} opponent moves were inference only: none is in any batch "
                     "(absent, not off-policy); every sample above is a learning player's move")
    if report.states:
        mismatched = sum(it.states_mismatched for it in report.iterations)
        lines.append(f"{report.states} states that values were bootstrapped from recomputed, {mismatched} differing")
    if report.inactive:
        lines.append(f"{report.inactive} of the samples are steps of agents that had left their episode: recorded "
                     "and recomputed, never trained on (agent_active 0)")
    lines.append(report.verdict)
    return "\n".join(lines)


def main(run_dir: str, tolerance: float = 1e-5) -> int:
    """``lockstep audit RUN_DIR``: print the report, ending with its verdict line. Returns the exit code:
    0 PASS, 1 FAIL (see ``IterationAudit.failures``), 2 nothing to audit (no trail, or no batch in it)."""
    try:
        policies = policies_of(Path(run_dir))
        reports = {policy: check(Path(run_dir), tolerance, policy) for policy in policies}
    except AuditError as err:
        print(f"lockstep audit: {err}", file=sys.stderr)
        return 2
    for policy, report in reports.items():
        if policy is not None:  # several policies: each one's trail, its own versions
            print(f"policy {policy}:")
        print(format_report(report))
    if len(reports) > 1:
        failed = [policy for policy, report in reports.items() if report.exit_code]
        print(f"FAIL: policies {failed}" if failed else f"PASS: every policy ({', '.join(reports)})")
    return max(report.exit_code for report in reports.values())
