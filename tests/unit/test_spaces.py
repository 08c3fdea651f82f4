"""Structured observation spaces: Dict and Tuple trees of leaves, described, carried and checked leaf by leaf."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lockstep.algo.normalize import LeafStatistics, ObsNormalizer, as_tensors
from lockstep.config import ModelConfig
from lockstep.envs import SpaceSpec, env_spec, make_vector_env, stack_records, to_records
from lockstep.learner.inference import act
from lockstep.models import Policy, build_policy
from lockstep.models.encoders import LeafEncoders, OneHot
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import CodecError, encode
from lockstep.transport.messages import (
    DEFAULT_BOUNDS,
    DEFAULT_HELLO_LIMITS,
    MAX_AGENTS,
    MAX_LEAVES,
    StepBounds,
    check_hello,
    hello_from_proto,
    space_from_proto,
    space_to_proto,
    step_from_proto,
    step_to_proto,
)
from lockstep.transport.shm.layout import Layout

GLIMPSE = "lockstep.envs.tasks:Glimpse"

NESTED = gym.spaces.Dict({
    "image": gym.spaces.Box(0, 255, (3, 8, 8), np.uint8),
    "goal": gym.spaces.Dict({"position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                             "kind": gym.spaces.Discrete(4)}),
    "pair": gym.spaces.Tuple((gym.spaces.MultiDiscrete([3, 5]), gym.spaces.MultiBinary(4))),
})


def test_a_nested_space_is_a_tree_of_leaves_named_by_their_paths():
    spec = SpaceSpec.from_space(NESTED)
    assert spec.tree and spec.shape == ()
    assert spec.paths() == ("goal.kind", "goal.position", "image", "pair[0]", "pair[1]")
    kinds = {path: leaf.kind for path, leaf in spec.leaves}
    assert kinds == {"goal.kind": "discrete", "goal.position": "box", "image": "box", "pair[0]": "multi_discrete",
                     "pair[1]": "multi_binary"}
    assert dict(spec.leaves)["image"].image and not dict(spec.leaves)["goal.position"].image
    assert dict(spec.leaves)["pair[0]"].nvec == (3, 5)
    # the records keep each leaf's own dtype: the image stays uint8
    assert spec.array_dtype["image"] == np.dtype((np.uint8, (3, 8, 8)))


def test_records_hold_what_the_env_observed_leaf_by_leaf():
    spec = SpaceSpec.from_space(NESTED)
    NESTED.seed(0)
    samples = [NESTED.sample() for _ in range(3)]
    records = stack_records(samples, spec)
    assert records.shape == (3,)
    for i, sample in enumerate(samples):
        assert (records["image"][i] == sample["image"]).all()
        assert records["goal.kind"][i] == sample["goal"]["kind"]
        assert (records["pair[0]"][i] == sample["pair"][0]).all()
    vec = make_vector_env(GLIMPSE, 2)
    obs, _ = vec.reset(seed=[1, 2])
    batch = to_records(obs, env_spec(GLIMPSE).observation)
    assert (batch["image"] == obs["image"]).all() and (batch["step"] == obs["step"]).all()
    vec.close()


def test_an_unsupported_leaf_is_refused_at_start_naming_the_key_and_obs_keys():
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (3, 8, 8), np.uint8), "mission": gym.spaces.Text(20)})
    with pytest.raises(ValueError, match=r"observation leaf 'mission' is a Text space.*env.obs_keys"):
        SpaceSpec.from_space(space)
    kept = SpaceSpec.from_space(space, ["image"])  # env.obs_keys leaves the text out
    assert kept.paths() == ("image",)
    with pytest.raises(ValueError, match=r"env.obs_keys names \['direction'\].*its keys are \['image', 'mission'\]"):
        SpaceSpec.from_space(space, ["direction"])
    with pytest.raises(ValueError, match="selects keys of a Dict observation"):
        SpaceSpec.from_space(gym.spaces.Box(0, 1, (2,)), ["image"])


def test_a_tree_travels_in_the_hello_and_differences_are_named_by_leaf():
    spec = SpaceSpec.from_space(NESTED)
    back = space_from_proto(pb.Space.FromString(space_to_proto(spec).SerializeToString()), "hello.observation_space")
    assert spec.mismatch(back) is None and back.mismatch(spec) is None
    moved = SpaceSpec.from_space(gym.spaces.Dict({**NESTED.spaces, "goal": gym.spaces.Dict({
        "position": gym.spaces.Box(-1.0, 1.0, (3,), np.float32), "kind": gym.spaces.Discrete(4)})}))
    assert spec.mismatch(moved).startswith("leaf 'goal.position': Box(shape=(3,)")
    fewer = SpaceSpec.from_space(NESTED, ["image", "goal"])
    assert "has no leaf 'pair[0]'" in spec.mismatch(fewer)
    assert "has a leaf 'pair[0]' the learner's does not" in fewer.mismatch(spec)
    assert spec.mismatch(SpaceSpec.from_space(NESTED["image"])).endswith(f"does not match {spec.describe()}")


def test_a_flat_space_is_one_leaf_and_its_hello_is_as_it_always_was():
    box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    spec = SpaceSpec.from_space(box)
    assert not spec.tree and spec.leaf_specs() == (("", spec),)
    message = space_to_proto(spec)
    assert not message.leaves and not message.nvec and message.kind == pb.Space.BOX
    assert to_records(np.zeros((2, 4), np.float32), spec).dtype == np.float32


def _hello_space(space: pb.Space) -> pb.Hello:
    return pb.Hello(num_envs=1, observation_space=space, action_space=pb.Space(kind=pb.Space.DISCRETE, n=2))


def test_a_hellos_agent_policies_are_bounded_and_arrive_as_sent():
    space = pb.Space(kind=pb.Space.BOX, shape=[2], dtype="float32", low=encode(np.zeros(2, np.float32)),
                     high=encode(np.ones(2, np.float32)))
    sent = {"scout_0": "a", "scout_1": "b", "pilot_0": "p"}
    assert hello_from_proto(pb.Hello(agent_policies=sent, observation_space=space, action_space=pb.Space(
        kind=pb.Space.DISCRETE, n=2, dtype="int64"))).agent_policies == sent
    many = _hello_space(pb.Space(kind=pb.Space.DISCRETE, n=2))
    many.agent_policies.update({f"agent_{i}": "p" for i in range(MAX_AGENTS + 1)})
    with pytest.raises(CodecError, match=f"hello.agent_policies: {MAX_AGENTS + 1} agents, over the limit of "
                                         f"{MAX_AGENTS}"):
        check_hello(many, DEFAULT_HELLO_LIMITS)
    for agent, policy in (("a" * 257, "p"), ("scout_0", "p" * 257)):
        long = _hello_space(pb.Space(kind=pb.Space.DISCRETE, n=2))
        long.agent_policies[agent] = policy
        with pytest.raises(CodecError, match="hello.agent_policies: an agent or policy name over the limit of 256"):
            check_hello(long, DEFAULT_HELLO_LIMITS)


def test_a_hellos_tree_is_bounded_before_anything_is_sized_from_it():
    leaf = pb.Space(kind=pb.Space.BOX, shape=[2], dtype="float32")
    many = pb.Space(kind=pb.Space.TREE, leaves=[pb.Leaf(path=f"k{i}", space=leaf) for i in range(MAX_LEAVES + 1)])
    with pytest.raises(CodecError, match=f"{MAX_LEAVES + 1} leaves, over the limit of {MAX_LEAVES}"):
        check_hello(_hello_space(many), DEFAULT_HELLO_LIMITS)
    wide = pb.Space(kind=pb.Space.TREE, leaves=[pb.Leaf(path="choice", space=pb.Space(
        kind=pb.Space.MULTI_DISCRETE, shape=[2], dtype="int64", nvec=[2, 1 << 30]))])
    with pytest.raises(CodecError, match="leaf 'choice'.*over the limit.*learner.max_space_elements"):
        check_hello(_hello_space(wide), DEFAULT_HELLO_LIMITS)
    nested = pb.Space(kind=pb.Space.TREE, leaves=[pb.Leaf(path="inner", space=pb.Space(
        kind=pb.Space.TREE, leaves=[pb.Leaf(path="x", space=leaf)]))])
    with pytest.raises(CodecError, match="leaf 'inner' has leaves of its own"):
        check_hello(_hello_space(nested), DEFAULT_HELLO_LIMITS)
    twice = pb.Space(kind=pb.Space.TREE, leaves=[pb.Leaf(path="x", space=leaf), pb.Leaf(path="x", space=leaf)])
    with pytest.raises(CodecError, match="must be distinct"):
        space_from_proto(twice, "hello.observation_space")


def _glimpse_step(k: int = 2):
    spec = env_spec(GLIMPSE).observation
    vec = make_vector_env(GLIMPSE, k)
    obs, _ = vec.reset(seed=list(range(k)))
    vec.close()
    records = to_records(obs, spec)
    msg = step_to_proto(records, np.zeros(k, np.float32), np.zeros(k, bool), np.zeros(k, bool), np.zeros(0, np.int64),
                        records[:0], np.zeros(0), np.zeros(0, np.int64))
    return spec, records, msg


def test_each_leaf_travels_as_its_own_tensor_and_arrives_as_records():
    spec, records, msg = _glimpse_step()
    assert not msg.HasField("observation")
    assert [(t.dtype, list(t.shape)) for t in msg.observation_leaves] == [
        ("float32", [2, 2]), ("uint8", [2, 1, 5, 5]), ("int64", [2])]
    data = step_from_proto(pb.Step.FromString(msg.SerializeToString()), 2, spec, DEFAULT_BOUNDS)
    assert data.obs.dtype == spec.array_dtype and (data.obs == records).all()


def test_a_step_is_checked_leaf_by_leaf_and_a_bad_leaf_is_named():
    spec, records, msg = _glimpse_step()
    short = pb.Step.FromString(msg.SerializeToString())
    del short.observation_leaves[-1]
    with pytest.raises(CodecError, match=r"2 tensors for an observation of 3 leaves \['clock', 'image', 'step'\]"):
        step_from_proto(short, 2, spec)
    wrong = records.copy()
    wrong["step"][0] = 99  # outside Discrete(8): the policy one-hot encodes it
    bad = step_to_proto(wrong, *(np.zeros(2, t) for t in (np.float32, bool, bool)), np.zeros(0, np.int64),
                        wrong[:0], np.zeros(0), np.zeros(0, np.int64))
    with pytest.raises(CodecError, match=r"step.observation leaf 'step': values outside Discrete\(8\)"):
        step_from_proto(bad, 2, spec)
    wrong = records.copy()
    wrong["clock"][1, 0] = np.nan
    bad = step_to_proto(wrong, *(np.zeros(2, t) for t in (np.float32, bool, bool)), np.zeros(0, np.int64),
                        wrong[:0], np.zeros(0), np.zeros(0, np.int64))
    with pytest.raises(CodecError, match=r"step.observation leaf 'clock': 1 non-finite value"):
        step_from_proto(bad, 2, spec)


@pytest.mark.parametrize("space, good, bad, shown", [
    (gym.spaces.Discrete(4), [3, 0], [4, 0], r"Discrete\(4\)"),
    (gym.spaces.MultiDiscrete([2, 5]), [[1, 4], [0, 0]], [[1, 5], [0, 0]], r"MultiDiscrete\(\[2, 5\]"),
    (gym.spaces.MultiBinary(3), [[1, 0, 1], [0, 0, 0]], [[1, 0, 2], [0, 0, 0]], r"MultiBinary"),
])
@pytest.mark.parametrize("sanitize", [False, True])
def test_a_flat_discrete_observation_outside_its_space_is_refused_by_name_sanitized_or_not(space, good, bad, shown,
                                                                                         sanitize):
    spec = SpaceSpec.from_space(space)
    bounds = StepBounds(sanitize=sanitize)

    def step(obs, final_obs=None):
        obs = np.array(obs, spec.array_dtype)
        truncated = np.array([final_obs is not None, False])
        final = obs[:0] if final_obs is None else np.array(final_obs, spec.array_dtype)
        return step_to_proto(obs, np.zeros(2, np.float32), np.zeros(2, bool), truncated,
                             np.arange(len(final), dtype=np.int64), final, np.zeros(0), np.zeros(0, np.int64))

    data = step_from_proto(step(good, good[:1]), 2, spec, bounds)
    assert (data.obs == np.array(good)).all() and (data.final_obs == np.array(good[:1])).all()
    with pytest.raises(CodecError, match=rf"^step.observation: values outside {shown}"):
        step_from_proto(step(bad), 2, spec, bounds)
    with pytest.raises(CodecError, match=rf"^step.final_observation: values outside {shown}"):
        step_from_proto(step(good, bad[:1]), 2, spec, bounds)


def test_the_shared_memory_layout_has_a_field_per_leaf_in_its_own_dtype():
    spec = env_spec(GLIMPSE)
    layout = Layout(3, spec.observation, spec.action)
    fields = {name: (f.dtype.name, f.shape) for name, f in layout.fields.items() if "obs" in name}
    leaves = {"clock": ("float32", (3, 2)), "image": ("uint8", (3, 1, 5, 5)), "step": ("int64", (3,))}
    assert fields == {f"{name}/{path}": leaf for name in ("obs", "final_obs") for path, leaf in leaves.items()}
    flat = Layout(3, env_spec("CartPole-v1").observation, env_spec("CartPole-v1").action)
    assert {name for name in flat.fields if "obs" in name} == {"obs", "final_obs"}


def test_the_policy_encodes_each_leaf_and_concatenates_the_features():
    spec = SpaceSpec.from_space(NESTED)
    encoders = LeafEncoders(spec)
    # one-hot 4, the position 2, the small CNN's 128 for an 8x8 image, one-hot 3 + 5, the 4 bits
    assert encoders.width == 4 + 2 + 128 + 8 + 4
    NESTED.seed(1)
    records = stack_records([NESTED.sample() for _ in range(5)], spec)
    assert encoders(as_tensors(records, torch.device("cpu"))).shape == (5, encoders.width)
    assert OneHot((3, 5))(torch.tensor([[2, 0]])).tolist() == [[0, 0, 1, 1, 0, 0, 0, 0]]
    for lstm in (0, 8):
        policy = build_policy(spec, SpaceSpec("discrete", (), "int64", n=3), ModelConfig(hidden=[16], lstm_size=lstm))
        obs = as_tensors(records, torch.device("cpu"))
        action, logprob, value, state = policy.step(obs, torch.full((5, policy.noise_width), 0.5),
                                                    torch.as_tensor(policy.initial_state(5)))
        assert action.shape == (5,) and value.shape == (5,) and state.shape == (5, policy.state_size)
    with pytest.raises(ValueError, match="a Dict or Tuple observation gets an encoder per leaf"):
        build_policy(spec, SpaceSpec("discrete", (), "int64", n=3), ModelConfig(kind="nature-cnn"))


def test_normalization_keeps_statistics_of_each_box_leaf_but_images():
    spec = SpaceSpec.from_space(NESTED)
    stats = LeafStatistics(spec)
    assert list(stats.leaves) == ["goal.position"]  # not the image, not the discrete leaves
    NESTED.seed(2)
    records = stack_records([NESTED.sample() for _ in range(64)], spec)
    stats.leaves["goal.position"].update(records["goal.position"])
    normalize = ObsNormalizer(stats.mean, stats.var, 5.0, torch.device("cpu"))
    out = normalize(as_tensors(records, torch.device("cpu")))
    assert out["image"].dtype == torch.uint8 and out["goal.kind"].dtype == torch.int64
    assert abs(float(out["goal.position"].mean())) < 0.1 and abs(float(out["goal.position"].std()) - 1) < 0.1


class _SeesLeaves(Policy):
    """A custom policy on a Dict observation: ``features`` gets one tensor per leaf, keyed by path."""

    def __init__(self, observation: SpaceSpec, action: SpaceSpec) -> None:
        super().__init__(action)
        self.encoders = LeafEncoders(observation)
        self.head = torch.nn.Linear(self.encoders.width, self.action_dim + 1)
        self.seen: list[dict] = []

    def features(self, obs):
        self.seen.append({path: (x.dtype, tuple(x.shape)) for path, x in obs.items()})
        out = self.head(self.encoders(obs))
        return out[:, :-1], out[:, -1]


def test_a_custom_policy_gets_a_dict_of_tensors_one_per_leaf():
    spec = env_spec(GLIMPSE)
    policy = _SeesLeaves(spec.observation, spec.action)
    _, records, _ = _glimpse_step(3)
    normalize = ObsNormalizer(None, None, 10.0, torch.device("cpu"))
    actions, _, _, _ = act(policy, normalize, records, np.full((3, policy.noise_width), 0.5), policy.initial_state(3),
                           torch.device("cpu"))
    assert actions.shape == (3,)
    assert policy.seen == [{"clock": (torch.float32, (3, 2)), "image": (torch.uint8, (3, 1, 5, 5)),
                            "step": (torch.int64, (3,))}]


def test_each_slot_of_a_vector_env_gets_its_own_row_of_every_action_part():
    """What PettingZoo slots and turn-based self-play step each game with (``spaces.slot_action``)."""
    from lockstep.envs.spaces import slot_action

    parts = {"button": np.array([0, 2]), "dial": np.array([[0.5], [-0.5]], np.float32)}
    assert slot_action(parts, 1)["button"] == 2 and slot_action(parts, 1)["dial"].tolist() == [-0.5]
    pair = (np.array([1, 0]), np.array([[1, 1], [0, 1]]))
    assert slot_action(pair, 0)[0] == 1 and slot_action(pair, 0)[1].tolist() == [1, 1]
    assert slot_action(np.array([3, 4]), 1) == 4
