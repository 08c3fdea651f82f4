"""One policy API: a feedforward and a recurrent policy answer the same calls with the same shapes,
the feedforward one with a state of 0 floats per slot, so that no caller asks which kind it holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lockstep.config import ModelConfig
from lockstep.envs import SpaceSpec, env_spec
from lockstep.models import Policy, build_policy

CARTPOLE = env_spec("CartPole-v1")
BOX = SpaceSpec("box", (2,), "float32", low=-np.ones(2, np.float32), high=np.ones(2, np.float32))
T, N = 5, 3


def _policy(action: SpaceSpec, lstm_size: int) -> Policy:
    torch.manual_seed(0)
    model = ModelConfig(hidden=[16], lstm_size=lstm_size)
    return build_policy(CARTPOLE.observation, action, model).eval().requires_grad_(False)


@pytest.mark.parametrize("action", [CARTPOLE.action, BOX], ids=["discrete", "box"])
@pytest.mark.parametrize("lstm_size", [0, 8], ids=["feedforward", "recurrent"])
def test_every_policy_answers_step_evaluate_mode_and_bootstrap_in_the_same_shapes(action, lstm_size):
    policy = _policy(action, lstm_size)
    S = policy.state_size
    assert S == (16 if lstm_size else 0)
    act_shape = () if action.discrete else (2,)
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(T, N, 4, generator=gen)
    noise = torch.rand(T, N, policy.noise_width, generator=gen).clamp(1e-6, 1 - 1e-6)
    starts = torch.zeros(T, N, dtype=torch.bool)
    starts[3, 1] = True
    initial = torch.as_tensor(policy.initial_state(N))
    assert initial.shape == (N, S) and not initial.any()

    state, actions, logprobs, values = initial, [], [], []
    for t in range(T):  # inference: reset where an episode starts, then one step
        state = torch.where(starts[t][:, None], torch.zeros_like(state), state)
        action_t, logprob, value, state = policy.step(obs[t], noise[t], state)
        assert action_t.shape == (N, *act_shape) and logprob.shape == value.shape == (N,) and state.shape == (N, S)
        actions.append(action_t), logprobs.append(logprob), values.append(value)
    actions = torch.stack(actions)

    logprob, entropy, value = policy.evaluate(obs, actions, starts, initial)  # training: [T, N] sequences
    assert logprob.shape == entropy.shape == value.shape == (T, N)
    torch.testing.assert_close(logprob, torch.stack(logprobs), rtol=0, atol=1e-6)
    torch.testing.assert_close(value, torch.stack(values), rtol=0, atol=1e-6)

    replayed, after = policy.evaluate_step(obs[0], actions[0], initial)  # the audit's replay of one step
    assert after.shape == (N, S)
    torch.testing.assert_close(replayed, logprobs[0], rtol=0, atol=0)

    mode, after = policy.mode(obs[0], initial)  # deterministic evaluation
    assert mode.shape == (N, *act_shape) and after.shape == (N, S)

    states = policy.states(obs, starts, initial)  # bootstrap: the state after the last step, then its value
    assert states.shape == (T, N, S)
    assert policy.value_after(obs[-1], states[-1]).shape == (N,)


def test_a_feedforward_policy_ignores_starts_and_state():
    policy = _policy(CARTPOLE.action, 0)
    obs = torch.randn(T, N, 4)
    actions = torch.randint(0, 2, (T, N))
    empty = torch.as_tensor(policy.initial_state(N))
    reset = policy.evaluate(obs, actions, torch.ones(T, N, dtype=torch.bool), empty)
    kept = policy.evaluate(obs, actions, torch.zeros(T, N, dtype=torch.bool), empty)
    for a, b in zip(reset, kept, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # each step is its own: a sequence's rows are the rows of one pass over its flattened samples
    flat = policy.evaluate(obs.reshape(1, T * N, 4), actions.reshape(1, T * N),
                           torch.zeros(1, T * N, dtype=torch.bool), torch.zeros(T * N, 0))
    torch.testing.assert_close(flat[0].reshape(T, N), kept[0], rtol=0, atol=0)


def test_a_policy_without_features_says_what_to_implement():
    class Empty(Policy):
        pass

    with pytest.raises(NotImplementedError, match="must implement features"):
        Empty(CARTPOLE.action).step(torch.zeros(1, 4), torch.full((1, 2), 0.5), torch.zeros(1, 0))
