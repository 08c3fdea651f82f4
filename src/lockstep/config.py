"""The configuration: one typed dataclass tree, loaded from YAML, overridden from the command line.

Defaults are CleanRL's published CartPole settings (``ppo.py``) so results are comparable.
The resolved tree is written to ``config.yaml`` in every run directory.

*Presets* are YAML configs shipped inside the package (``lockstep/presets/NAME.yaml``), so
they work after a plain ``pip install``; ``load`` takes a preset name wherever it takes a
path. ``DEFAULT_PRESET`` is what ``lockstep train`` uses when no ``--config`` is given.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lockstep.sync import NAMES as SYNC_NAMES

TRANSPORTS = ("shm", "grpc", "inprocess")  # learner.transport
LAUNCHERS = ("local", "ray")  # env.launcher
MODEL_KINDS = ("auto", "mlp", "nature-cnn", "small-cnn")  # model.kind


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"  # Gymnasium id or package.module:callable
    actors: int = 2  # local actor processes started by `lockstep train`
    envs_per_actor: int = 2  # environments in each actor's vector env
    actor_restarts: int = 10  # a dead actor of `lockstep train` is restarted at most this often (local or Ray)
    # Who starts `lockstep train`'s actors: "local" (processes on this host) or "ray" (Ray actors, placed and
    # restarted by Ray, always over gRPC; docs/cluster.md). The ray_* fields apply to "ray" only.
    launcher: str = "local"
    ray_address: str = ""  # join this Ray cluster (HOST:6379, or auto); empty: start a Ray instance on this host
    ray_num_cpus: int = 0  # CPUs of the Ray instance started here (0: this host's cores, more if the actors need)
    ray_cpus_per_actor: float = 1.0  # CPUs Ray reserves for each actor when it places them
    normalize_obs: bool = False  # running mean/std of observations, part of the policy snapshot
    normalize_reward: bool = False  # scale rewards by the std of the discounted return
    clip_obs: float = 10.0  # after normalization
    clip_reward: float = 10.0  # after scaling


@dataclass
class PPOConfig:
    steps_per_env: int = 128  # T: actions each env slot takes from one policy version
    total_steps: int = 500_000  # env steps to train for
    lr: float = 2.5e-4
    anneal_lr: bool = True  # linear decay to 0 over the run
    gamma: float = 0.99
    gae_lambda: float = 0.95
    epochs: int = 4
    minibatches: int = 4
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True  # per-minibatch advantage normalization
    adam_eps: float = 1e-5
    target_kl: float | None = None  # stop the epochs early when the approximate KL exceeds it


@dataclass
class ModelConfig:
    # auto: the MLP for flat observations, a CNN for images [C, H, W] (nature-cnn from 36 pixels up, else small-cnn)
    kind: str = "auto"
    hidden: list[int] = field(default_factory=lambda: [64, 64])  # the MLP's layers
    activation: str = "tanh"  # the MLP's: tanh or relu
    init_log_std: float = 0.0  # Gaussian head only
    lstm_size: int = 0  # > 0: an LSTM of this size after the torso; the learner keeps each env slot's state
    critic_lstm: bool = False  # with lstm_size: the critic gets its own LSTM beside the actor's (else they share one)
    # Your own network: "package.module:factory" or "path/to/file.py:factory", a callable
    # (observation SpaceSpec, action SpaceSpec, this ModelConfig) -> lockstep.Policy (docs/custom-policy.md)
    policy: str = ""


@dataclass
class SyncConfig:
    strategy: str = "strict"  # strict, pipelined, or a reference strategy (see docs/synchronization.md)
    max_lag: int = 1  # pipelined: most versions a sample may lag the version that trains on it
    inference_threads: int = 2  # reference strategies: threads that run their per-request forward passes
    jitter_ms: float = 0.0  # adversarial testing: random delays up to this in inference, training and guards
    stall_s: float = 10.0  # a phase collecting longer than this counts as a stall (and is logged)
    phase_cutoff: float | None = None  # DD-PPO: close a phase once this fraction of env slots is full ...
    min_unroll: float = 0.25  # ... and every other slot has at least this fraction of T steps


@dataclass
class LearnerConfig:
    listen: str = "127.0.0.1:0"  # host:port; port 0 picks a free one
    min_actors: int = 0  # actors to wait for before the first phase; 0 means env.actors
    max_batch: int = 4096  # most env observations in one forward pass
    max_wait_ms: float = 2.0  # longest a request waits for others to share its forward pass
    device: str = "auto"  # auto, cpu or cuda
    torch_threads: int = 1  # small networks run fastest on one thread
    max_message_mb: int = 64  # largest message accepted from an actor; larger ones are refused
    sanitize: bool = False  # replace NaN/inf in observations and rewards instead of refusing the step
    tls_cert: str = ""  # PEM certificate chain; with tls_key, the learner serves TLS
    tls_key: str = ""  # PEM private key
    # How `lockstep train`'s local actors reach the learner: "shm" (actor processes; shared memory and a unix
    # socket), "grpc" (actor processes over loopback) or "inprocess" (env loops as tasks in the learner process,
    # for cheap envs). The learner serves gRPC and the unix socket either way; remote actors use gRPC.
    transport: str = "shm"


@dataclass
class RunConfig:
    name: str = ""  # defaults to <env>-<seed>-<time>
    run_dir: str = ""  # defaults to runs/<name>
    seed: int = 1
    thresholds: list[float] = field(default_factory=list)  # returns whose first crossing summary.json records
    checkpoint_every: int = 0  # iterations between periodic checkpoints (0: none by count)
    checkpoint_minutes: float = 0.0  # minutes between periodic checkpoints (0: none by time)
    keep_checkpoints: int = 3  # periodic checkpoints kept (the newest); final.pt is always kept
    progress: bool = True  # live progress display
    stop_at_return: float | None = None  # stop early once the running mean reaches it
    time_limit_s: float | None = None  # stop after this many seconds of training, whatever the step count
    collect_only: bool = False  # benchmarks: collect and check batches, never update the policy
    audit: bool = False  # write every training batch and policy version to audit/ (see `lockstep audit`)
    wandb: bool = False  # also log to Weights & Biases (pip install -e '.[wandb]'; WANDB_MODE=offline respected)
    wandb_project: str = "lockstep"  # the W&B project (WANDB_PROJECT overrides it)


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def batch_size(self) -> int:
        return self.env.actors * self.env.envs_per_actor * self.ppo.steps_per_env

    @property
    def min_actors(self) -> int:
        return self.learner.min_actors or self.env.actors

    def return_thresholds(self) -> list[float]:
        """The returns whose first crossing a run records: ``run.thresholds``, or, when none are given,
        the environment's own ``reward_threshold`` from its Gymnasium registration (CartPole-v1: 475);
        empty for an environment without one."""
        if self.run.thresholds:
            return list(self.run.thresholds)
        from lockstep.envs import reward_threshold  # gymnasium: loaded only when asked

        solved = reward_threshold(self.env.id)
        return [] if solved is None else [solved]

    def validate(self) -> None:
        checks = [
            (self.env.actors >= 1, f"env.actors must be at least 1, got {self.env.actors}"),
            (self.env.envs_per_actor >= 1, f"env.envs_per_actor must be at least 1, got {self.env.envs_per_actor}"),
            (self.ppo.steps_per_env >= 1, f"ppo.steps_per_env must be at least 1, got {self.ppo.steps_per_env}"),
            (self.ppo.minibatches >= 1, f"ppo.minibatches must be at least 1, got {self.ppo.minibatches}"),
            (self.ppo.epochs >= 1, f"ppo.epochs must be at least 1, got {self.ppo.epochs}"),
            (self.ppo.total_steps >= 1, f"ppo.total_steps must be positive, got {self.ppo.total_steps}"),
            (self.learner.device in ("auto", "cpu", "cuda") or self.learner.device.startswith("cuda:"),
             f"learner.device must be auto, cpu or cuda, got {self.learner.device!r}"),
            (self.sync.strategy in SYNC_NAMES,
             f"sync.strategy must be one of {', '.join(SYNC_NAMES)}, got {self.sync.strategy!r}"),
            (self.sync.phase_cutoff is None or 0 < self.sync.phase_cutoff <= 1,
             f"sync.phase_cutoff must be in (0, 1], got {self.sync.phase_cutoff}"),
            (0 <= self.sync.min_unroll <= 1, f"sync.min_unroll must be in [0, 1], got {self.sync.min_unroll}"),
            (self.sync.max_lag >= 1,
             f"sync.max_lag must be at least 1 (0 is sync.strategy=strict), got {self.sync.max_lag}"),
            (self.env.launcher in LAUNCHERS,
             f"env.launcher must be one of {', '.join(LAUNCHERS)}, got {self.env.launcher!r}"),
            (self.env.ray_num_cpus >= 0,
             f"env.ray_num_cpus must be 0 (automatic) or positive, got {self.env.ray_num_cpus}"),
            (self.env.ray_cpus_per_actor >= 0,
             f"env.ray_cpus_per_actor must not be negative, got {self.env.ray_cpus_per_actor}"),
            (self.learner.transport in TRANSPORTS,
             f"learner.transport must be one of {', '.join(TRANSPORTS)}, got {self.learner.transport!r}"),
            (self.model.kind in MODEL_KINDS,
             f"model.kind must be one of {', '.join(MODEL_KINDS)}, got {self.model.kind!r}"),
            (self.model.lstm_size >= 0, f"model.lstm_size must be 0 (no LSTM) or positive, got {self.model.lstm_size}"),
            (self.model.lstm_size == 0 or self.sync.strategy in ("strict", "pipelined"),
             f"model.lstm_size > 0 needs sync.strategy strict or pipelined (snapshots keep the recurrent state "
             f"per slot); {self.sync.strategy!r} updates the model in place"),
            (not self.model.critic_lstm or self.model.lstm_size > 0,
             "model.critic_lstm gives the critic its own LSTM: it needs model.lstm_size > 0"),
            (self.model.activation in ("tanh", "relu"),
             f"model.activation must be tanh or relu, got {self.model.activation!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


class ConfigError(ValueError):
    """A configuration value or key that is not valid."""


def to_dict(config: Config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_dict(data: dict[str, Any], base: Config | None = None) -> Config:
    """Merge a nested dict (from YAML) into ``base``; unknown keys are errors."""
    config = base if base is not None else Config()
    for section, values in (data or {}).items():
        if not hasattr(config, section) or not dataclasses.is_dataclass(getattr(config, section)):
            sections = [f.name for f in dataclasses.fields(Config)]
            raise ConfigError(f"unknown config section {section!r}; sections: {sections}")
        if not isinstance(values, dict):
            raise ConfigError(f"config section {section!r} must be a mapping, got {values!r}")
        for key, value in values.items():
            set_value(config, f"{section}.{key}", value)
    return config


DEFAULT_PRESET = "cartpole-fast"  # lockstep train without --config, for its environment (CartPole-v1)
_PRESETS = "presets"  # folder inside the lockstep package


def preset_names() -> list[str]:
    """The names of the presets shipped with the package, sorted."""
    folder = importlib.resources.files("lockstep").joinpath(_PRESETS)
    return sorted(f.name[: -len(".yaml")] for f in folder.iterdir() if f.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    """The YAML text of the preset ``name``; a ConfigError that lists the presets if there is none."""
    folder = importlib.resources.files("lockstep").joinpath(_PRESETS)
    resource = None if "/" in name or "\\" in name else folder.joinpath(f"{name}.yaml")
    if resource is None or not resource.is_file():
        raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(preset_names())} "
                          "(or give the path to a YAML file)")
    return resource.read_text()


def load(source: str | Path, base: Config | None = None) -> Config:
    """The config in ``source``, merged over ``base`` (default: the built-in defaults).

    ``source`` is the path of a YAML file or, when no such file exists, the name of a preset
    (``cartpole-fast``, see ``preset_names``). A source that is neither is a ConfigError
    that lists the presets.
    """
    path = Path(source)
    if path.is_file():
        text = path.read_text()
    elif isinstance(source, Path) or path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        raise ConfigError(f"config file {path} does not exist; give an existing YAML file or a preset "
                          f"name: {', '.join(preset_names())}")
    else:
        text = preset_text(str(source))
    return from_dict(yaml.safe_load(text) or {}, base)


def default_config(env_id: str | None = None) -> Config:
    """The config a run starts from when no ``--config`` is given: the ``DEFAULT_PRESET`` for its
    environment (CartPole-v1), the built-in defaults for any other ``env_id``."""
    preset = load(DEFAULT_PRESET)
    if env_id is None or env_id == preset.env.id:
        return preset
    return Config()


def apply_sets(config: Config, items: list[str]) -> None:
    """Apply ``--set KEY=VALUE`` items (``section.key=value``) in order."""
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        set_value(config, key.strip(), value.strip())


def name_run(config: Config) -> Path:
    """Fill in ``run.name`` (default ``<env>-s<seed>-<date>-<time>``) and ``run.run_dir`` (default
    ``runs/<name>``) where they are empty; return the run directory."""
    if not config.run.name:
        import time

        env_name = config.env.id.replace("/", "_").replace(":", "_")
        config.run.name = f"{env_name}-s{config.run.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not config.run.run_dir:
        config.run.run_dir = str(Path("runs") / config.run.name)
    return Path(config.run.run_dir)


def save(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def set_value(config: Config, dotted: str, value: Any) -> None:
    """Set ``section.key`` to ``value``, converting strings from the command line to the field's type."""
    section_name, _, key = dotted.partition(".")
    section = getattr(config, section_name, None)
    if section is None or not dataclasses.is_dataclass(section):
        raise ConfigError(f"unknown config section {section_name!r} in {dotted!r}")
    hints = typing.get_type_hints(type(section))
    if key not in hints:
        known = ", ".join(f.name for f in dataclasses.fields(section))
        raise ConfigError(f"unknown config key {dotted!r}; {section_name} has: {known}")
    try:
        setattr(section, key, _coerce(value, hints[key]))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{dotted}: cannot use {value!r}: {err}") from err


def _coerce(value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0])
    if origin is list:
        if isinstance(value, str):
            value = [v for v in value.replace("[", "").replace("]", "").split(",") if v.strip()]
        return [_coerce(v, args[0]) for v in value]
    if hint is bool:
        if isinstance(value, str):
            lowered = value.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        return bool(value)
    if hint is int:
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                value = float(value)  # accepts 1e6
        if isinstance(value, float) and not value.is_integer():
            raise ValueError("expected an integer")
        return int(value)
    if hint is float:
        return float(value)
    if hint is str:
        return str(value)
    raise TypeError(f"unsupported field type {hint}")
