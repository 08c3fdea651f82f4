"""Train CartPole with your own network through lockstep's Python API.

    python examples/custom_policy.py                 # about 60k env steps, a few seconds
    python examples/custom_policy.py --audit         # and recompute every behaviour log-prob afterwards

A policy subclasses ``lockstep.Policy`` and says how an observation becomes (policy-head output, value):
for Discrete(n) actions the head output is n logits, for a Box action the Gaussian's mean (the
log-std is ``Policy.log_std``, created by ``Policy.__init__``). Sampling, log-probs, entropy, the
versioning of snapshots and the audit are lockstep's. The factory ``make_policy`` is what lockstep
calls, here and whenever the run's network must be built again (audit, evaluation, resume): its
place is recorded in the run's config.yaml as ``model.policy``.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

import lockstep


class LayerNormPolicy(lockstep.Policy):
    """Separate policy and value networks, each with layer normalization after its first layer.

    (A trunk shared by both heads trains worse on CartPole at these settings: the value loss, with
    returns in the hundreds, dominates the shared features. CleanRL keeps them apart for that reason.)
    """

    def __init__(self, observation: lockstep.SpaceSpec, action: lockstep.SpaceSpec, width: int) -> None:
        super().__init__(action)
        inputs = math.prod(observation.shape)
        self.policy_net = nn.Sequential(_block(inputs, width), nn.Linear(width, self.action_dim))
        self.value_net = nn.Sequential(_block(inputs, width), nn.Linear(width, 1))
        nn.init.orthogonal_(self.policy_net[-1].weight, 0.01)  # near-uniform actions at the start
        nn.init.zeros_(self.policy_net[-1].bias)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [B, *obs] -> (logits or means [B, action_dim], value [B])."""
        flat = obs.flatten(1).float()
        return self.policy_net(flat), self.value_net(flat).squeeze(-1)


def _block(inputs: int, width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, width), nn.LayerNorm(width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())


def make_policy(observation: lockstep.SpaceSpec, action: lockstep.SpaceSpec, model) -> LayerNormPolicy:
    """The factory lockstep calls with the env's spaces and the config's ``model`` section."""
    return LayerNormPolicy(observation, action, width=model.hidden[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-steps", type=int, default=250_000)
    parser.add_argument("--run-dir", default=None, help="default runs/<name>")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--audit", action="store_true", help="write the audit trail and check it afterwards")
    args = parser.parse_args()

    config = lockstep.load_config("cartpole-fast", run__seed=args.seed, ppo__total_steps=args.total_steps,
                                  ppo__lr=args.lr, run__progress=False, run__audit=args.audit)
    summary = lockstep.train(config, policy=make_policy, run_dir=args.run_dir)
    solved = summary["first_reached"].get("475")
    print(f"{summary['env_steps']:,} env steps, mean return of the last episodes {summary['episode_return_mean']:.1f}; "
          + (f"reached 475 after {solved['env_steps']:,} env steps" if solved else "did not reach 475"))
    if args.audit:
        from lockstep.tools.audit import main as audit

        raise SystemExit(audit(config.run.run_dir))


if __name__ == "__main__":
    main()
