"""The configuration: one typed dataclass tree, the single source of every setting.

Each field declares its name, type, default, one-line help, allowed values (a ``Literal`` type), the range it
must lie in and, where users know one, a short command-line flag. The loader (``from_dict``, ``set_value``)
checks values against those declarations; the ``lockstep`` command generates its flags from them
(``lockstep.cli``), and ``python -m lockstep.config --markdown FILE`` writes the reference
(docs/configuration.md) from them.

Defaults are CleanRL's published CartPole settings (``ppo.py``) so results are comparable.
The resolved tree is written to ``config.yaml`` in every run directory.

*Presets* are YAML configs shipped inside the package (``lockstep/presets/NAME.yaml``), so
they work after a plain ``pip install``; ``load`` takes a preset name wherever it takes a
path. ``DEFAULT_PRESET`` is what ``lockstep train`` uses when no ``--config`` is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import importlib.util
import logging
import math
import numbers
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from lockstep.common.files import atomic_write
from lockstep.sync import NAMES as SYNC_NAMES
from lockstep.sync import REFERENCE_DESIGNS, moved

log = logging.getLogger(__name__)

Transport = Literal["shm", "grpc", "inprocess"]
Launcher = Literal["local", "ray"]
VectorMode = Literal["sync", "async"]
EventLoop = Literal["auto", "asyncio", "uvloop"]
InferenceKernel = Literal["auto", "torch"]
UpdatePrecision = Literal["float32", "bfloat16", "auto"]
ModelKind = Literal["auto", "mlp", "nature-cnn", "small-cnn"]
Activation = Literal["tanh", "relu"]
RecurrentCore = Literal["lstm", "gru"]
CriticInput = Literal["own", "global"]
ImageLayout = Literal["auto", "channels_first", "channels_last"]  # lockstep.envs.images.IMAGE_LAYOUTS
SyncStrategy = Literal[SYNC_NAMES]  # the registry in lockstep.sync names the strategies


def setting(default: Any, help: str, *, flag: str | None = None, ge: float | None = None,
            gt: float | None = None, le: float | None = None) -> Any:
    """A config field: its default, its help (written once: ``--help`` and docs/configuration.md show it), the
    short flag that ``lockstep train`` also accepts for it (a boolean's short flag sets the opposite of its
    default: ``--audit``, ``--no-progress``), and the range its value must lie in (``ge``: at least, ``gt``:
    more than, ``le``: at most)."""
    metadata = {"help": help, "flag": flag, "ge": ge, "gt": gt, "le": le}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class EnvConfig:
    """The environment every actor steps, and what the learner does to its observations and rewards."""

    id: str = setting("CartPole-v1", "env id: a Gymnasium id (CartPole-v1), module:EnvId (a package that registers "
                                     "EnvId when imported, e.g. ale_py:ALE/Pong-v5), atari:GAME, minatar:GAME, "
                                     "minigrid:ENV, vizdoom:SCENARIO, pettingzoo:MODULE, masked:ENV or "
                                     "package.module:callable (a function that returns a gymnasium.Env)", flag="--env")
    kwargs: dict[str, Any] = setting({}, "keyword arguments for the env's constructor (gym.make, a PettingZoo "
                                         "parallel_env, your callable), e.g. {N: 4, max_cycles: 50}; every actor "
                                         "builds its envs with them", flag="--env-kwargs")
    agent_id: bool = setting(False, "a PettingZoo parallel env: add each agent's one-hot index (a leaf agent_id of "
                                    "the observation), so that the policy the agents share can tell them apart",
                             flag="--agent-id")
    obs_keys: list[str] = setting([], "a Dict observation: the keys to keep (e.g. [image, direction]; a Text or "
                                      "other leaf lockstep cannot encode must be left out); empty: every key. A "
                                      "PettingZoo slot's agent_active and agent_id are kept whether named or not")
    action_mask_key: str = setting("action_mask", "a Dict observation's leaf that masks the Discrete and "
                                   "MultiDiscrete actions (one number per choice, 0: not allowed), if it has one; "
                                   "empty: no mask")
    image_layout: ImageLayout = setting(
        "auto", "the channel order of the uint8 image observations of a Gymnasium id, a factory or a PettingZoo "
                "parallel env (H, W, C: channels_last; C, H, W: channels_first), which the actors transpose to "
                "lockstep's [C, H, W]; auto: channels-last where the last axis is 1, 3 or 4 and smaller than the "
                "other two", flag="--image-layout")
    normalize_obs: bool = setting(False, "keep a running mean/std of observations (of each Box leaf that is not "
                                         "a uint8 image), part of the policy snapshot")
    normalize_images: bool = setting(
        False, "with normalize_obs, a uint8 image observation too: each pixel by its own running mean/std (Sample "
               "Factory's normalize_input), the CNN taking the normalized values instead of the bytes / 255")
    normalize_reward: bool = setting(False, "scale rewards by the std of the discounted return")
    clip_obs: float = setting(10.0, "clip observations to this magnitude after normalization", gt=0)
    clip_reward: float = setting(10.0, "clip rewards to this magnitude after scaling", gt=0)

    def vector_kwargs(self) -> dict[str, Any]:
        """What an actor's vector env is built with: ``kwargs``, ``image_layout`` other than auto, and for a PettingZoo
        parallel env ``agent_id`` and ``action_mask_key`` (which its slots of departed agents fill with ones) under
        keys of lockstep's own, which ``envs`` takes out before the env's constructor sees the rest."""
        from lockstep.envs.images import IMAGE_LAYOUT_KWARG
        from lockstep.envs.pettingzoo import AGENT_ID_KWARG, DEFAULT_MASK_KEY, MASK_KEY_KWARG

        own = {AGENT_ID_KWARG: True} if self.agent_id else {}
        if self.image_layout != "auto":
            own[IMAGE_LAYOUT_KWARG] = self.image_layout
        if self.action_mask_key != DEFAULT_MASK_KEY and _parallel_multiagent(self.id):
            own[MASK_KEY_KWARG] = self.action_mask_key
        return {**self.kwargs, **own}



@dataclass
class ActorsConfig:
    """The actors: how many, how many envs each steps, and who starts them and how they reach the learner."""

    count: int = setting(2, "actors `lockstep train` starts (for `lockstep learner`: the actors it expects)",
                         flag="--actors", ge=1)
    envs_per_actor: int = setting(2, "environments in each actor's vector env", flag="--envs-per-actor", ge=1)
    vector: VectorMode = setting(
        "sync", "how an actor steps its envs: sync (one after the other, in the actor's process) or async (each in a "
                "process of its own, side by side: for envs that take milliseconds a step; Gymnasium ids, actor "
                "processes and Ray actors)", flag="--vector")
    transport: Transport = setting(
        "shm", "how `lockstep train`'s local actors reach the learner: shm (actor processes; shared memory and a "
               "unix socket), grpc (actor processes over loopback) or inprocess (env loops as tasks in the learner "
               "process, for cheap envs). The learner serves gRPC and the unix socket either way; remote actors "
               "use gRPC", flag="--transport")
    splits: int = setting(
        1, "groups an actor's envs are split into, each with a connection and a thread of its own, and to the learner "
           "a member of its phases, as an actor is: one group steps its envs while the learner infers the others' "
           "actions (double buffering, as Sample Factory's worker_num_splits); actors.envs_per_actor must divide "
           "by it. The learner's first phase waits for (learner.min_actors or actors.count) x splits members",
        flag="--splits", ge=1, le=64)
    launcher: Launcher = setting(
        "local", "who starts `lockstep train`'s actors: local (processes on this host) or ray (Ray actors, placed "
                 "and restarted by Ray, always over gRPC; pip install -e '.[ray]', docs/cluster-and-security.md)",
        flag="--launcher")
    restarts: int = setting(10, "a dead actor of `lockstep train` is restarted at most this often (local or Ray)",
                            ge=0)
    ray_address: str = setting(
        "", "launcher ray: join the Ray cluster at HOST:6379 (or auto; learner.listen must then be an address its "
            "nodes reach); empty: start a Ray instance on this host", flag="--ray-address")
    ray_num_cpus: int = setting(
        0, "launcher ray, Ray started here: the CPUs it offers (0: this host's cores, or enough for actors.count)",
        flag="--ray-num-cpus", ge=0)
    ray_cpus_per_actor: float = setting(1.0, "launcher ray: the CPUs Ray reserves for each actor when it places them",
                                        flag="--ray-cpus-per-actor", ge=0)
    ray_resources: dict[str, float] = setting(
        {}, "launcher ray: custom resources Ray reserves for each actor, e.g. {actor_host: 1}: Ray places actors "
            "only on nodes that offer them (ray start --resources '{\"actor_host\": 8}'); a Ray instance started "
            "here offers enough for actors.count", flag="--ray-resources", gt=0)


@dataclass
class PPOConfig:
    """PPO's hyperparameters (CleanRL's names)."""

    steps_per_env: int = setting(128, "T: the actions each env slot takes from one policy version",
                                 flag="--steps-per-env", ge=1)
    total_steps: int = setting(500_000, "env steps to train for", flag="--total-steps", ge=1)
    lr: float = setting(2.5e-4, "Adam's learning rate", flag="--lr", gt=0)
    anneal_lr: bool = setting(True, "decay the learning rate linearly to 0 over the run")
    gamma: float = setting(0.99, "discount factor", ge=0, le=1)
    gae_lambda: float = setting(0.95, "GAE's lambda (not used with ppo.vtrace, whose trace ppo.vtrace_c_bar "
                                      "cuts instead)", ge=0, le=1)
    epochs: int = setting(4, "passes over each training batch", ge=1)
    minibatches: int = setting(4, "minibatches each pass splits the batch into", ge=1)
    clip_coef: float = setting(0.2, "the clipped objective's epsilon", gt=0)
    clip_vloss: bool = setting(True, "clip the value loss as the policy loss is clipped")
    ent_coef: float = setting(0.01, "entropy bonus coefficient", ge=0)
    vf_coef: float = setting(0.5, "value loss coefficient", ge=0)
    max_grad_norm: float = setting(0.5, "clip the gradient's global norm to this", gt=0)
    norm_adv: bool = setting(True, "normalize advantages per minibatch")
    adam_eps: float = setting(1e-5, "Adam's epsilon", gt=0)
    target_kl: float | None = setting(None, "stop the epochs early when the approximate KL exceeds this "
                                            "(none: never)", gt=0)
    vtrace: bool | None = setting(None, "targets and advantages by V-trace (IMPALA) instead of GAE, for samples "
                                        "that lag the version that trains on them (none: on with sync.strategy "
                                        "async, off otherwise)")
    vtrace_rho_bar: float = setting(1.0, "with ppo.vtrace: rho-bar, where the importance weights of the targets and "
                                         "advantages are truncated (larger: the value of the trained policy, less "
                                         "bias, more variance)", gt=0)
    vtrace_c_bar: float = setting(1.0, "with ppo.vtrace: c-bar, where the importance weights that carry the trace "
                                       "back are truncated (how far a step's correction reaches)", gt=0)


@dataclass
class ModelConfig:
    """The policy and value network."""

    kind: ModelKind = setting("auto", "the network: auto picks the MLP for flat observations and a CNN for images "
                                      "[C, H, W] (nature-cnn from 36 pixels up, else small-cnn)")
    hidden: list[int] = setting([64, 64], "the MLP's hidden layer sizes", ge=1)
    activation: Activation = setting("tanh", "the MLP's activation")
    init_log_std: float = setting(0.0, "the Gaussian head's initial log standard deviation (Box actions only; "
                                       "bounded so that the standard deviation, its exp, is a normal float32)",
                                  ge=-20, le=20)
    lstm_size: int = setting(0, "> 0: an LSTM of this size after the torso; the learner keeps each env slot's "
                                "state", ge=0)
    rnn: RecurrentCore = setting("lstm", "with model.lstm_size: the recurrent core, lstm (a slot's state is its h and "
                                         "c, 2 x lstm_size floats) or gru (Sample Factory's: h alone, lstm_size "
                                         "floats, fewer multiplications per step)")
    critic_lstm: bool = setting(False, "with model.lstm_size: the critic gets its own LSTM beside the actor's "
                                       "(else they share one); with model.rnn gru, its own GRU")
    critic_input: CriticInput = setting(
        "own", "what the critic reads: own (the agent's observation, as the actor) or global (a PettingZoo parallel "
               "env: also the env's global state and the agent's one-hot id, MAPPO's centralized critic; the actor "
               "still reads its own observation only)")
    policy: str = setting("", "your own network: package.module:factory or path/to/file.py:factory, a callable "
                              "(observation SpaceSpec, action SpaceSpec, this ModelConfig) -> lockstep.Policy "
                              "(docs/custom-policy.md)")


@dataclass
class LearnerConfig:
    """The learner process: where it listens, how it batches inference, where it runs the network."""

    listen: str = setting("127.0.0.1:0", "host:port the learner listens on; port 0 picks a free one",
                          flag="--listen")
    min_actors: int = setting(0, "actors to wait for before the first phase (0: actors.count), each actors.splits "
                                 "members", flag="--min-actors", ge=0)
    max_batch: int = setting(4096, "most env observations in one forward pass", ge=1)
    max_wait_ms: float = setting(2.0, "longest a request waits for others to share its forward pass", ge=0)
    device: str = setting("auto", "where the network runs: auto, cpu, cuda or cuda:N", flag="--device")
    torch_threads: int = setting(1, "torch's threads (small networks run fastest on one)", ge=1)
    event_loop: EventLoop = setting("auto", "the learner's event loop: asyncio's own, or uvloop's (in C: less "
                                            "Python work per message, which shared-memory actors notice; pip "
                                            "install 'lockstep[fast]'); auto: uvloop where it is installed")
    inference_kernel: InferenceKernel = setting(
        "auto", "what runs the forward pass and sampling of each policy version: auto (the built-in MLP policy on "
                "the CPU at small batches in numpy, without torch's per-op dispatch, the same numbers to float32 "
                "rounding; torch elsewhere; docs/performance.md measures both) or torch (always)")
    update_precision: UpdatePrecision = setting(
        "float32", "the precision of the convolutional torso in the update's forward and backward passes: bfloat16 "
                   "(torch.autocast) runs them about 1.5x faster on a CPU with AVX512-BF16 or AMX and on a recent "
                   "GPU, slower on other CPUs; auto: bfloat16 where the device computes it natively, else float32. "
                   "Parameters, gradients, Adam, the recurrent core, the heads and the loss stay float32, as do "
                   "inference and the audit. No effect on a policy without a CNN")
    deterministic: bool = setting(False, "on a GPU, the same kernels and reduction orders on every run (cuDNN's "
                                         "deterministic algorithms, cuBLAS's fixed workspace): bitwise repeats, "
                                         "at some speed; the CPU is deterministic anyway")
    max_message_mb: int = setting(64, "the largest message accepted from an actor; larger ones are refused", ge=1)
    sanitize: bool = setting(False, "replace NaN (by 0) and values beyond learner.max_observation / "
                                    "learner.max_reward (by the bound) instead of refusing the step",
                             flag="--sanitize")
    max_observation: float = setting(1e10, "the largest magnitude of an observation accepted from an actor; larger "
                                           "ones are refused (within it a value stays finite in the learner's "
                                           "float32)", gt=0, le=1e38)
    max_reward: float = setting(1e10, "the largest magnitude of a reward or a finished episode's return accepted "
                                      "from an actor; larger ones are refused", gt=0, le=1e38)
    max_envs_per_actor: int = setting(65_536, "the most envs one actor's hello may bring; a larger hello is refused "
                                              "before anything is allocated for it", ge=1)
    max_id_length: int = setting(256, "the longest run id, env id, dtype name, agent name or policy name a hello "
                                      "may carry", ge=1)
    max_space_elements: int = setting(1 << 24, "the most elements a hello's observation or action space may have",
                                      ge=1)
    tls_cert: str = setting("", "PEM certificate chain; with learner.tls_key, the learner serves TLS",
                            flag="--tls-cert")
    tls_key: str = setting("", "PEM private key for learner.tls_cert", flag="--tls-key")
    hello_timeout_s: float = setting(30.0, "a connection that has not said hello within this many seconds is "
                                           "closed (gRPC: also one that has not finished its HTTP/2 handshake, "
                                           "or has had no open stream for this long; at least 0.1 s, as an honest "
                                           "actor opens its stream some milliseconds after it connects)", ge=0.1)
    max_connections: int = setting(1024, "the most connections open at once on each of the gRPC port and the "
                                         "unix socket; more are refused (the learner raises its open-file limit "
                                         "to fit)", ge=1)

    def server_limits(self) -> dict[str, Any]:
        """The limits both servers apply to every connection: keyword arguments of ``LearnerServer`` and
        ``LocalServer``."""
        return {"max_message_bytes": self.max_message_mb * 1024 * 1024,
                "hello_timeout_s": self.hello_timeout_s, "max_connections": self.max_connections,
                "hello_limits": self.hello_limits}

    @property
    def hello_limits(self):
        """These limits as the transports check them (``transport.messages.HelloLimits``)."""
        from lockstep.transport.messages import HelloLimits

        return HelloLimits(self.max_envs_per_actor, self.max_id_length, self.max_space_elements)


@dataclass
class SyncConfig:
    """Synchronization between inference and training (docs/synchronization.md)."""

    strategy: SyncStrategy = setting("strict", "strict (the admission gate, strictly on-policy), pipelined "
                                               "(collection overlaps training, lag <= sync.max_lag, 1 by default) "
                                               "or async (actors held only at the lag bound, sync.max_lag 4 by "
                                               "default, V-trace by default)", flag="--sync")
    max_lag: int | None = setting(None, "pipelined and async: the most versions a sample may lag the version that "
                                        "trains on it (none: 1 for pipelined, 4 for async; strict allows no lag "
                                        "and does not read it)", flag="--max-lag", ge=1)
    stall_s: float = setting(10.0, "the stall rule's floor: a phase collecting longer than this and than 3 x the "
                                   "median collect time of the last 20 phases counts as a stall and is logged with "
                                   "the actors it waits for (before any phase has closed: longer than this); a "
                                   "steady pace is no stall, however slow (docs/reliability.md)", gt=0)
    step_deadline_s: float = setting(300.0, "the step deadline's ceiling: an actor the oldest open phase waits "
                                            "for that sends no step for this long after the learner's last answer "
                                            "is evicted, as if it had disconnected (its unfinished unroll "
                                            "dropped), however slow its own and the other actors' steps have been "
                                            "(docs/reliability.md)", gt=0)
    first_step_deadline_s: float = setting(20.0, "the step deadline of an actor that has sent no step since its "
                                                 "hello (its envs' first reset comes before it), unless the other "
                                                 "actors' pace gives longer; longer than any honest reset", gt=0)
    step_deadline_min_s: float = setting(60.0, "the step deadline's floor once an actor has stepped: longer than "
                                               "any honest env step", gt=0)
    step_deadline_factor: float = setting(10.0, "the step deadline follows the actors' pace: this many times the "
                                                "longer of the actor's slowest recent step and the other actors' "
                                                "typical one, between the floor and the ceiling", ge=1)
    phase_cutoff: float | None = setting(None, "DD-PPO straggler cut-off: close a phase once this fraction of env "
                                               "slots is full (none: wait for all)", flag="--phase-cutoff", gt=0,
                                         le=1)
    min_unroll: float = setting(0.25, "with sync.phase_cutoff: the fraction of T every other slot must have",
                                flag="--min-unroll", ge=0, le=1)


Opponents = Literal["self", "pool"]


@dataclass
class SelfPlayConfig:
    """Self-play on a turn-based game (env id pettingzoo:MODULE of an AEC game): who plays the opponents' moves.
    Only the learning player's moves are trained; the opponents' are inference on the learner, never in a batch."""

    opponents: Opponents = setting("pool", "self: every opponent move by the version that acts for the learning "
                                   "player; pool: by frozen past versions (selfplay.pool_size, "
                                   "selfplay.snapshot_every)")
    pool_size: int = setting(8, "pool: the most past versions kept; the oldest leaves when a newer one joins", ge=1)
    snapshot_every: int = setting(10, "pool: a version joins the pool every this many versions (version 0 first)",
                                  ge=1)
    latest: float = setting(0.5, "pool: the chance that a slot's opponent is the current version rather than one "
                            "drawn uniformly from the pool; drawn for every slot at each new version", ge=0, le=1)
    random: float = setting(0.0, "the chance that a slot's opponent plays uniformly random legal moves instead (drawn "
                            "for every slot at each new version, after the above), so that the policy keeps "
                            "beating simple play while its pool gets stronger", ge=0, le=1)


@dataclass
class RunConfig:
    """This run: its name and directory, seed, stopping rules, checkpoints and what it records."""

    name: str = setting("", "run name (empty: <env>-s<seed>-<date>-<time>)", flag="--name")
    run_dir: str = setting("", "run directory (empty: runs/<name>)", flag="--run-dir")
    seed: int = setting(1, "the run's seed (the welcome carries it to the actors as an unsigned 64-bit integer)",
                        flag="--seed", ge=0, le=2**64 - 1)
    thresholds: list[float] = setting([], "returns whose first crossing summary.json records, any numbers (empty: "
                                          "the env's reward_threshold); a config file's are dropped when the "
                                          "command line changes its env.id and gives none")
    checkpoint_every: int = setting(0, "iterations between periodic checkpoints (0: none by count)",
                                    flag="--checkpoint-every", ge=0)
    checkpoint_minutes: float = setting(0.0, "minutes between periodic checkpoints (0: none by time)",
                                        flag="--checkpoint-minutes", ge=0)
    keep_checkpoints: int = setting(3, "periodic checkpoints kept (the newest, so at least the one just written: "
                                       "what a crashed run resumes from); final.pt is always kept", ge=1)
    progress: bool = setting(True, "show a live progress display", flag="--no-progress")
    stop_at_return: float | None = setting(None, "stop early once the running mean return reaches this, any number "
                                                 "(none: never)", flag="--stop-at-return")
    time_limit_s: float | None = setting(None, "stop after this many seconds of training, whatever the step count "
                                               "(none: no limit)", gt=0)
    eval_every: int = setting(0, "evaluate while training every N iterations (0: never): run.eval_episodes episodes "
                                 "of the newest policy version on an env of its own, in a process of its own, which "
                                 "training never waits for (an evaluation due while one runs is skipped)",
                              flag="--eval-every", ge=0)
    eval_episodes: int = setting(10, "episodes each evaluation while training plays", ge=1)
    eval_deterministic: bool = setting(True, "evaluation while training takes the most likely action (false: samples "
                                             "as the actors' policy does)")
    eval_video_every: int = setting(0, "with run.eval_every: record every M-th evaluation's episodes as "
                                       "RUN_DIR/videos/iter_NNNNNN/episode-NNN.mp4 where the env renders (0: never; "
                                       "pip install -e '.[video]')", ge=0)
    eval_rank_by: str = setting("trained", "which return of an evaluation while training is its eval_return_mean, "
                                           "ranking versions for checkpoints/best.pt: trained (the agents' of the "
                                           "policies that train: every agent's with one policy), team (a PettingZoo "
                                           "parallel env's episodes' team returns) or a policy's name (its agents')")
    audit: bool = setting(False, "write every training batch and policy version to RUN_DIR/audit/ (see "
                                 "`lockstep audit`)", flag="--audit")
    wandb: bool = setting(False, "also log to Weights & Biases (pip install -e '.[wandb]'; offline into "
                                 "RUN_DIR/wandb without credentials or with WANDB_MODE=offline)", flag="--wandb")
    wandb_project: str = setting("lockstep", "the W&B project (WANDB_PROJECT overrides it)")


@dataclass
class PolicyConfig:
    """One named policy of a PettingZoo parallel env's run (the ``policies`` mapping, docs/environments.md).

    Not a section of settings: ``policies`` maps names the user chooses to these, e.g.
    ``{predator: {agents: ["adversary_*"]}, prey: {agents: ["agent_*"]}}``."""

    agents: list[str] = field(default_factory=list)  # patterns (fnmatch) of the agent names it acts for
    model: dict[str, Any] = field(default_factory=dict)  # its network: keys of the model section, over the run's
    train: bool = True  # false: frozen, acting with the parameters it was loaded with (``load``) and never trained
    load: str = ""  # a run directory or a checkpoint whose parameters (and observation statistics) it starts from
    load_policy: str = ""  # which policy of a source that has several (default: one of the same name)


POLICY_KEYS = tuple(f.name for f in dataclasses.fields(PolicyConfig))
EVAL_RANKINGS = ("trained", "team")  # run.eval_rank_by's values besides a policy's name


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    run: RunConfig = field(default_factory=RunConfig)
    # several policies of a PettingZoo parallel env (empty: every agent acts with the one shared policy)
    policies: dict[str, PolicyConfig] = field(default_factory=dict)

    def vector_kwargs(self) -> dict[str, Any]:
        """What an actor's vector env is built with: ``env.vector_kwargs()`` and, with several policies, each
        policy's agent patterns (``envs.pettingzoo.POLICIES_KWARG``), by which the env lays out its slots."""
        from lockstep.envs.pettingzoo import GLOBAL_STATE_KWARG, POLICIES_KWARG

        kwargs = self.env.vector_kwargs()
        if self.policies:
            kwargs[POLICIES_KWARG] = {name: list(policy.agents) for name, policy in self.policies.items()}
        if self._global_critic():
            kwargs[GLOBAL_STATE_KWARG] = True  # a slot's observation carries the env's state for the critic
        return kwargs

    def _global_critic(self) -> bool:
        """Whether a critic reads the env's global state (``model.critic_input``, the run's or a policy's)."""
        models = [self.model_of(name) for name in self.policies] or [self.model]
        return any(model.critic_input == "global" for model in models)

    def uses_vtrace(self) -> bool:
        """Whether the trainers take V-trace's targets and advantages: ``ppo.vtrace``, or, where it is left unset,
        whether the run is asynchronous (``sync.strategy async``)."""
        return self.ppo.vtrace if self.ppo.vtrace is not None else self.sync.strategy == "async"

    def model_of(self, policy: str) -> ModelConfig:
        """The network of ``policy``: the run's model section with the policy's own keys over it."""
        return dataclasses.replace(self.model, **self.policies[policy].model)

    @property
    def batch_size(self) -> int:
        return self.actors.count * self.actors.envs_per_actor * self.ppo.steps_per_env

    @property
    def min_actors(self) -> int:
        """The members the first phase waits for: each actor is ``actors.splits`` of them."""
        return (self.learner.min_actors or self.actors.count) * self.actors.splits

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
        """Check every field against its declaration (as the loader does; fields may have been assigned
        directly since), then the rules that tie fields together."""
        for s in SETTINGS:
            s.check(getattr(getattr(self, s.section), s.key))
        device = self.learner.device
        rules = [
            (device in ("auto", "cpu", "cuda") or device.startswith("cuda:"),
             f"learner.device must be auto, cpu, cuda or cuda:N, got {device!r}"),
            (not self.run.eval_video_every or self.run.eval_every > 0,
             "run.eval_video_every records evaluations while training: it needs run.eval_every > 0"),
            (self.learner.event_loop != "uvloop" or importlib.util.find_spec("uvloop") is not None,
             "learner.event_loop is uvloop, but the uvloop package is not installed: pip install 'lockstep[fast]' "
             "(Linux and macOS), or use learner.event_loop asyncio"),
            (not self.env.normalize_images or self.env.normalize_obs,
             "env.normalize_images normalizes image observations with the running statistics of env.normalize_obs: "
             "set env.normalize_obs true too"),
            (not self.env.agent_id or _parallel_multiagent(self.env.id),
             f"env.agent_id adds an agent index to a PettingZoo parallel env's observations; {self.env.id} is none"),
            (self.actors.vector == "sync" or self.actors.transport != "inprocess" or self.actors.launcher == "ray",
             "actors.vector async steps each env in a process of its own, and the inprocess transport steps envs on "
             "the learner's event loop, for envs cheaper than a process round trip: use actors.transport shm"),
            (self.actors.vector == "sync" or self.env.id.partition(":")[0] not in ("envpool", "pettingzoo"),
             f"actors.vector async steps Gymnasium envs in processes of their own; {self.env.id} has a vector env "
             "of its own: leave actors.vector at sync"),
            (splits_problem(self.actors.envs_per_actor, self.actors.splits) is None,
             splits_problem(self.actors.envs_per_actor, self.actors.splits)),
            (self.actors.splits == 1 or self.actors.transport != "inprocess" or self.actors.launcher == "ray",
             "actors.splits > 1 overlaps an actor's env steps with the learner's inference over connections of "
             "their own; the inprocess transport steps envs on the learner's event loop, which has nothing to "
             "overlap them with: use actors.transport shm (or set actors.splits to 1)"),
            (not self.model.critic_lstm or self.model.lstm_size > 0,
             "model.critic_lstm gives the critic its own LSTM: it needs model.lstm_size > 0"),
            (self.model.rnn == "lstm" or self.model.lstm_size > 0,
             f"model.rnn {self.model.rnn} picks the recurrent core: it needs model.lstm_size > 0 (the core's size)"),
            (not self._global_critic() or _parallel_multiagent(self.env.id),
             f"model.critic_input global gives the critic a PettingZoo parallel env's global state; {self.env.id} "
             "is none: use model.critic_input own"),
            (self.model.critic_input != "global" or self.model.lstm_size == 0,
             "model.critic_input global reads the global state in the feedforward network's critic MLP; with "
             "model.lstm_size > 0 the actor and critic share the torso under the LSTM, which would let the actor "
             "read it: set model.lstm_size to 0 or model.critic_input to own"),
            # the global state reaches every slot, so a recurrent policy of another's would read it in its torso
            (not self._global_critic() or not any(self.model_of(name).lstm_size for name in self.policies),
             "a policy's model.critic_input global puts the env's global state in every slot's observation, and a "
             "policy with model.lstm_size > 0 reads all of it under its LSTM, its actor too: make every policy "
             "feedforward, or every critic_input own"),
        ]
        for ok, message in rules:
            if not ok:
                raise ConfigError(message)
        if self.policies:
            self._validate_policies()
        self._validate_eval_rank_by()

    def _validate_eval_rank_by(self) -> None:
        """``run.eval_rank_by``: trained, team where there is a team, or one of the run's policies by name."""
        rank_by = self.run.eval_rank_by
        if rank_by in EVAL_RANKINGS:
            if rank_by in self.policies:
                raise ConfigError(f"run.eval_rank_by {rank_by!r} is both a ranking and the name of a policy; rename "
                                  f"policies.{rank_by}")
            if rank_by == "team" and not _parallel_multiagent(self.env.id):
                raise ConfigError(f"run.eval_rank_by team ranks by a PettingZoo parallel env's team return; "
                                  f"{self.env.id} is none: use trained")
        elif rank_by not in self.policies:
            raise ConfigError(f"run.eval_rank_by must be {', '.join(EVAL_RANKINGS)} or a policy of the run "
                              f"({', '.join(self.policies) or 'it has none: policies is empty'}), got {rank_by!r}")

    def _validate_policies(self) -> None:
        """The ``policies`` mapping: names, agent patterns, each policy's model keys; a parallel env's only."""
        if not _parallel_multiagent(self.env.id):
            raise ConfigError(f"policies maps the agents of a PettingZoo parallel env to several policies; "
                              f"{self.env.id} is none: leave policies empty")
        for name, policy in self.policies.items():
            if not name.isidentifier():
                raise ConfigError(f"policies: {name!r} is not a valid policy name (letters, digits and _)")
            if not policy.agents or not all(isinstance(p, str) and p for p in policy.agents):
                raise ConfigError(f"policies.{name}.agents must list the agent names (or patterns such as "
                                  f"'adversary_*') it acts for, got {policy.agents!r}")
            for key, value in policy.model.items():
                declared = setting_of(f"model.{key}")
                try:
                    declared.check(value)
                except ConfigError as err:  # named as the user wrote it: policies.NAME.model.KEY
                    raise ConfigError(f"policies.{name}.{err}") from None
            if policy.load_policy and not policy.load:
                raise ConfigError(f"policies.{name}.load_policy names a policy of policies.{name}.load, which is "
                                  "empty")
        if self.env.obs_keys:
            raise ConfigError("env.obs_keys selects keys of one agent's observation; with several policies each "
                              "policy's agents have their own: leave env.obs_keys empty (drop keys in a wrapper)")
        if not any(policy.train for policy in self.policies.values()):
            raise ConfigError("policies: every policy is frozen (train: false), so nothing would train; let one "
                              "train")


def splits_problem(envs_per_actor: int, splits: int) -> str | None:
    """Why an actor of ``envs_per_actor`` envs cannot run ``splits`` groups of them (None: it can)."""
    if envs_per_actor % splits == 0:
        return None
    return (f"actors.splits {splits} splits an actor's envs into groups of equal size, but actors.envs_per_actor "
            f"{envs_per_actor} does not divide by it: make actors.envs_per_actor a multiple of {splits}")


def _parallel_multiagent(env_id: str) -> bool:
    """Whether ``env_id`` is a PettingZoo parallel env (not a turn-based self-play game, which evaluates)."""
    scheme, _, name = env_id.partition(":")
    if scheme != "pettingzoo":
        return False
    from lockstep.envs import selfplay  # imports the game's module: only for a pettingzoo id

    try:
        return not selfplay.is_turn_based(name)
    except ValueError:  # a module that does not import: the env's own check names it
        return False


class ConfigError(ValueError):
    """A configuration value or key that is not valid."""


# --- the declarations, read once -------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One config field as declared: ``section.key``, its type, default, help, short flag and range."""

    section: str
    key: str
    hint: Any
    default: Any
    help: str
    flag: str | None
    ge: float | None
    gt: float | None
    le: float | None

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def choices(self) -> tuple[str, ...]:
        """The allowed values of a ``Literal`` field; empty for any other."""
        return typing.get_args(self.hint) if typing.get_origin(self.hint) is Literal else ()

    @property
    def numeric(self) -> bool:
        """Whether the value is a number, or a list or mapping of numbers: what a range can bound."""
        return _numbers(self.hint)

    def check(self, value: Any) -> None:
        """The one place that says a value is not allowed: not one of the choices, or out of range (for a list or
        a mapping of numbers: any of its numbers)."""
        if self.choices and value not in self.choices:
            withdrawn = WITHDRAWN.get((self.dotted, value)) if isinstance(value, str) else None
            raise ConfigError(withdrawn or f"{self.dotted} must be one of {', '.join(self.choices)}, got {value!r}")
        if value is None or isinstance(value, (bool, str)) or not self.numeric:
            return
        items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
        if any(isinstance(item, float) and math.isnan(item) for item in items):
            # every comparison with NaN is false: no range would refuse it, and no setting takes it
            raise ConfigError(f"{self.dotted} must be {self.range() or 'a number'}, got {value!r}")
        if self.range() and not all(self._within(item) for item in items):
            raise ConfigError(f"{self.dotted} must be {self.range()}, got {value!r}")

    def _within(self, number: Any) -> bool:
        if not isinstance(number, numbers.Real) or isinstance(number, bool) or number != number:  # NaN: no range
            return False
        return not ((self.ge is not None and number < self.ge) or (self.gt is not None and number <= self.gt)
                    or (self.le is not None and number > self.le))

    def range(self) -> str:
        """The declared range as a reader writes it: ``>= 1``, ``> 0 and <= 1``, ``each >= 1`` (a list's numbers),
        ``each value >= 0`` (a mapping's); empty where none is."""
        low = "" if self.ge is None and self.gt is None else (
            f">= {_bound(self.ge)}" if self.gt is None else f"> {_bound(self.gt)}")
        high = "" if self.le is None else f"<= {_bound(self.le)}"
        text = " and ".join(part for part in (low, high) if part)
        origin = typing.get_origin(self.hint)
        return text and ("each " if origin is list else "each value " if origin is dict else "") + text

    def type_name(self) -> str:
        """The type as a reader writes it: ``int``, ``float or none``, ``list of int``, ``one of a, b``."""
        return _type_name(self.hint)


def _bound(number: float) -> str:
    return str(number) if isinstance(number, int) else f"{number:g}"  # an int exactly: the seed's 2**64 - 1


def _numbers(hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_numbers(a) for a in args if a is not type(None))
    if origin in (list, dict):
        return _numbers(args[-1])
    return hint in (int, float)  # not bool


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + " or none"
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return "mapping"
    return hint.__name__


SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if f.name != "policies")  # policies: a mapping


def sections() -> dict[str, type]:
    """Each section's name and dataclass, in the order of ``Config``."""
    hints = typing.get_type_hints(Config)
    return {name: hints[name] for name in SECTIONS}


def _declared() -> list[Setting]:
    found = []
    for section, cls in sections().items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            found.append(Setting(section, f.name, hints[f.name], default, f.metadata["help"], f.metadata["flag"],
                                 f.metadata["ge"], f.metadata["gt"], f.metadata["le"]))
    return found


SETTINGS = _declared()  # every config field as declared, section by section in the order of Config

# Keys that older versions read, and where they live now. A config file that uses one still loads (a run
# directory's config.yaml from before the move must resume, evaluate and audit); a --set or assignment fails.
MOVED = {
    "env.actors": "actors.count",
    "env.envs_per_actor": "actors.envs_per_actor",
    "env.actor_restarts": "actors.restarts",
    "env.launcher": "actors.launcher",
    "env.ray_address": "actors.ray_address",
    "env.ray_num_cpus": "actors.ray_num_cpus",
    "env.ray_cpus_per_actor": "actors.ray_cpus_per_actor",
    "learner.transport": "actors.transport",
}

# Values that older versions accepted and that left the training path: a config that gives one is refused
# with where it went. (The reference synchronization designs: docs/synchronization.md.)
WITHDRAWN = {("sync.strategy", name): f"sync.strategy {moved(name)}" for name in REFERENCE_DESIGNS}

_THREADS = ("the reference designs' inference threads are the synchronization benchmark's (the debug section "
            "is gone): python -m lockstep_bench.train --design NAME --inference-threads N (pip install -e ./dev)")

# Benchmark knobs that left the training path: the benchmarks set them on their own entry point
# (`python -m lockstep_bench.train --jitter-ms MS --collect-only ...`). A config file from before, which holds
# them at their old defaults, still loads; any other value is refused with where the knob went.
REMOVED = {
    "sync.jitter_ms": (0.0, "adversarial delays are a benchmark's: python -m lockstep_bench.train --jitter-ms MS"),
    "run.collect_only": (False, "collection-only runs are a benchmark's: python -m lockstep_bench.train "
                                "--collect-only"),
    "sync.inference_threads": (2, _THREADS),
    "debug.inference_threads": (2, _THREADS),
}


def to_dict(config: Config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_dict(data: dict[str, Any], base: Config | None = None) -> Config:
    """Merge a nested dict (from YAML) into ``base``; unknown keys are errors, moved keys are read where they
    live now (with a warning that names the new key)."""
    config = base if base is not None else Config()
    data = dict(data or {})
    if "policies" in data:
        config.policies = _policies(data.pop("policies"))
    for section, values in data.items():
        if section not in SECTIONS and not (isinstance(values, dict) and values
                                            and all(f"{section}.{key}" in REMOVED for key in values)):
            raise ConfigError(f"unknown config section {section!r}; sections: {list(SECTIONS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"config section {section!r} must be a mapping, got {values!r}")
    for section, values in data.items():
        for key, value in values.items():
            dotted = f"{section}.{key}"
            if dotted in REMOVED:
                _removed(dotted, value)
                continue
            if dotted in MOVED:
                dotted = _moved(dotted, data)
            set_value(config, dotted, value)
    return config


def _policies(data: Any) -> dict[str, PolicyConfig]:
    """The ``policies`` mapping from YAML: {name: {agents, model, train, load, load_policy}}."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"policies must map policy names to their settings, got {data!r}")
    policies = {}
    for name, values in data.items():
        values = values or {}
        if not isinstance(values, dict):
            raise ConfigError(f"policies.{name} must be a mapping of {', '.join(POLICY_KEYS)}, got {values!r}")
        unknown = sorted(set(values) - set(POLICY_KEYS))
        if unknown:
            raise ConfigError(f"policies.{name}: unknown key(s) {unknown}; a policy has {', '.join(POLICY_KEYS)}")
        agents = values.get("agents", [])
        agents = [agents] if isinstance(agents, str) else list(agents or [])
        model = values.get("model") or {}
        if not isinstance(model, dict):
            raise ConfigError(f"policies.{name}.model must be a mapping of model keys, got {model!r}")
        try:
            model = {key: _coerce(value, setting_of(f"model.{key}").hint) for key, value in model.items()}
            train = _coerce(values.get("train", True), bool)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"policies.{name}: {err}") from err
        policies[str(name)] = PolicyConfig([str(a) for a in agents], model, train, str(values.get("load") or ""),
                                           str(values.get("load_policy") or ""))
    return policies


def _removed(dotted: str, value: Any) -> None:
    old_default, where = REMOVED[dotted]
    if value != old_default:
        raise ConfigError(f"{dotted} is no longer a config key: {where}")


def _moved(old: str, data: dict[str, Any]) -> str:
    new = MOVED[old]
    section, key = new.split(".")
    if key in (data.get(section) or {}):
        raise ConfigError(f"{old} moved to {new}, and this config gives both: keep only {new}")
    log.warning("config key %s moved to %s; read it there (rename it in the file)", old, new)
    return new


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


def apply_sets(config: Config, items: list[str]) -> list[str]:
    """Apply ``--set KEY=VALUE`` items (``section.key=value``) in order; the keys they set."""
    keys = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        set_value(config, key.strip(), value.strip())
        keys.append(key.strip())
    return keys


def drop_thresholds_of_another_env(config: Config, env_id: str, given: set[str]) -> None:
    """A config file's ``run.thresholds`` are returns of its env ``env_id`` (a preset's: the figures its env is
    judged by, HalfCheetah's 1443): when the command line moves the run to another env and gives no thresholds
    of its own (``given``: the keys it set), they are dropped with a note, and the run records the new env's own
    ``reward_threshold`` instead (``Config.return_thresholds``)."""
    if config.env.id == env_id or not config.run.thresholds or "run.thresholds" in given:
        return
    log.info("run.thresholds %s are %s's; dropped for %s, which records its own reward_threshold if it "
             "registers one (set run.thresholds to choose)", config.run.thresholds, env_id, config.env.id)
    config.run.thresholds = []


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
    """Write ``config.yaml`` whole or not at all: a resume reads it, and a torn one would refuse to load."""
    atomic_write(Path(path), yaml.safe_dump(to_dict(config), sort_keys=False))


def setting_of(dotted: str) -> Setting:
    """The declaration of ``section.key``; a ConfigError that names the key and, for a moved key, where it
    lives now."""
    if dotted in MOVED:
        raise ConfigError(f"{dotted} moved to {MOVED[dotted]}: use {MOVED[dotted]}")
    if dotted in REMOVED:
        raise ConfigError(f"{dotted} is no longer a config key: {REMOVED[dotted][1]}")
    section, _, key = dotted.partition(".")
    if section not in SECTIONS:
        raise ConfigError(f"unknown config section {section!r} in {dotted!r}; sections: {list(SECTIONS)}")
    for s in SETTINGS:
        if s.dotted == dotted:
            return s
    known = ", ".join(s.key for s in SETTINGS if s.section == section)
    raise ConfigError(f"unknown config key {dotted!r}; {section} has: {known}")


def set_value(config: Config, dotted: str, value: Any) -> None:
    """Set ``section.key`` to ``value``, converting strings from the command line or YAML to the field's
    type and checking it against the field's declaration."""
    s = setting_of(dotted)
    try:
        converted = _coerce(value, s.hint)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{dotted}: cannot use {value!r}: {err}") from err
    s.check(converted)
    setattr(getattr(config, s.section), s.key, converted)


def _coerce(value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        return str(value)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0])
    if origin is dict:
        return _mapping(value)
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


def _mapping(value: Any) -> dict[str, Any]:
    """A mapping of names to YAML values: as YAML gave it, or a string of YAML or JSON (``{N: 4}``) from a flag."""
    if isinstance(value, str):
        value = yaml.safe_load(value) if value.strip() else {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        raise ValueError("expected a mapping of keyword names to values, e.g. {N: 4, max_cycles: 50}")
    return dict(value)



# --- the reference ----------------------------------------------------------------------------------


def reference() -> str:
    """docs/configuration.md: every section and field with its type, default, short flag and help."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Written by `python -m lockstep.config --markdown docs/configuration.md` from the dataclasses in",
        "     src/lockstep/config.py; edit those, not this file (a unit test compares the two). -->",
        "",
        "A run's configuration is one tree of sections. Set a field in a YAML file (`--config FILE` or a preset",
        "name), with `--set section.key=value` or with `--section.key value` on the command line of",
        "`lockstep train` and `lockstep learner`; the short flags below are the same fields. Later settings win:",
        "the file, then the flags, then each `--set` in order. The resolved tree is written to",
        "`RUN_DIR/config.yaml`. Values are checked when they are set: a field with choices takes only those,",
        "and a number only one in its range (`any`: every number is valid, as its help says).",
        "",
        f"Presets: {', '.join(f'`{n}`' for n in preset_names())} (default `{DEFAULT_PRESET}`).",
    ]
    for section, cls in sections().items():
        lines += ["", f"## {section}", "", (cls.__doc__ or "").strip(), "",
                  "| key | type | default | flag | range | help |", "|---|---|---|---|---|---|"]
        for s in (s for s in SETTINGS if s.section == section):
            lines.append(f"| `{s.dotted}` | {s.type_name()} | `{_yaml_value(s.default)}` | "
                         f"{f'`{s.flag}`' if s.flag else ''} | {s.range() or ('any' if s.numeric else '')} | "
                         f"{s.help.replace('|', '/')} |")
    lines += ["", "## policies", "", POLICIES_REFERENCE, "", "| key | type | default | what it is |",
              "|---|---|---|---|"]
    lines += [f"| `policies.NAME.{key}` | {kind} | `{_yaml_value(default)}` | {what} |"
              for key, kind, default, what in POLICY_REFERENCE]
    lines += ["", "## Moved keys", "",
              "Config files that use an old key still load, with a warning that names the new one; `--set` with "
              "an old key fails with the same message.", "", "| old key | now |", "|---|---|"]
    lines += [f"| `{old}` | `{new}` |" for old, new in MOVED.items()]
    return "\n".join(lines) + "\n"


POLICIES_REFERENCE = (
    "A PettingZoo parallel env's agents mapped to several named policies, each with its own network, optimizer, "
    "observation statistics, versions and checkpoints (docs/environments.md); empty (the default): every agent "
    "acts with one shared policy. Each agent goes to the first policy, in the order written, one of whose "
    "`agents` patterns matches its name; every agent needs one, every policy at least one agent. Example: "
    "`policies: {predator: {agents: [\"adversary_*\"]}, prey: {agents: [\"agent_*\"], train: false, load: "
    "runs/old}}`.")
POLICY_REFERENCE = (
    ("agents", "list of str", [], "patterns (`*`, `?`, `[seq]`) of the agent names the policy acts for"),
    ("model", "mapping", {}, "keys of the model section that the policy's network has instead of the run's, "
                             "e.g. `{hidden: [128, 128]}`, each with the model section's choices and range"),
    ("train", "bool", True, "false: frozen, acting with the parameters it was loaded with and never trained "
                            "(without `load`: its initial parameters)"),
    ("load", "str", "", "a run directory (its final checkpoint) or a checkpoint file the policy starts from: its "
                        "parameters and observation statistics"),
    ("load_policy", "str", "", "which policy of a `load` source that has several (default: the one of the same "
                               "name)"),
)


def _yaml_value(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").removesuffix("...").strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lockstep.config",
                                     description="Write the configuration reference (docs/configuration.md).")
    parser.add_argument("--markdown", metavar="FILE", required=True, help="the Markdown file to write")
    args = parser.parse_args(argv)
    Path(args.markdown).write_text(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
