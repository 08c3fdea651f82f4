"""CartPole declared as a Dict of two Box leaves (``tasks.SplitCartPole``) trains as CartPole does: its policy has
separate actor and critic networks on the leaves side by side, as the flat one has on the vector, so with one seed
and the same settings the two runs end with the same parameters, bit for bit."""

from __future__ import annotations

import torch

from lockstep import config as config_lib
from lockstep.api import train
from lockstep.learner import checkpoint


def _trained(env_id: str, run_dir) -> dict[str, torch.Tensor]:
    """The parameters after four iterations of the cartpole-fast preset on ``env_id``."""
    config = config_lib.load("cartpole-fast")
    config.env.id = env_id
    config.ppo.total_steps = 4 * config.batch_size
    config.learner.inference_kernel = "torch"  # the one kernel a Dict policy has
    config.learner.device = "cpu"
    config.run.progress = False
    train(config, run_dir=run_dir)
    return checkpoint.load(checkpoint.find(run_dir / "checkpoints"))["trainer"]["model"]


def test_cartpole_split_into_a_dict_trains_as_cartpole_does(tmp_path):
    flat = _trained("CartPole-v1", tmp_path / "flat")
    split = _trained("lockstep.envs.tasks:SplitCartPole", tmp_path / "split")
    assert split.keys() == flat.keys()
    for name, value in flat.items():
        torch.testing.assert_close(split[name], value, rtol=0, atol=0)
