"""Play a policy exported by ``lockstep export`` with onnxruntime and Gymnasium alone: no lockstep, no torch.

    lockstep train --env CartPole-v1 --run-dir runs/cartpole
    lockstep export runs/cartpole --format onnx --out cartpole.onnx
    python examples/deploy_onnx.py cartpole.onnx --episodes 10 --seed 0

The card beside the file (cartpole.onnx.json) names the env and the inputs; the file takes the observation as
the env gives it, with a batch dimension, and returns the action the env takes. The env is reset with ``--seed``
once and plays its episodes one after another, as ``lockstep eval --deterministic --seed`` plays them, so the
returns are the same. A recurrent policy's state starts at zeros and is carried from ``state_out``; a Dict or Tuple
observation is fed leaf by leaf (docs/deploy.md).
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np
import onnxruntime


def leaf(obs, name: str):
    """The value of input ``name`` (``obs``, ``obs.key``, ``obs.key.sub``, ``obs[0]``) of the env's observation."""
    path = name[len("obs"):]
    for part in path.replace("[", ".[").split("."):
        if part:
            obs = obs[int(part[1:-1])] if part.startswith("[") else obs[part]
    return obs


def play(model: str, episodes: int, seed: int) -> list[float]:
    card = json.loads(open(f"{model}.json").read())
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    inputs = {i["name"]: i for i in card["inputs"]}
    outputs = [o["name"] for o in card["outputs"]]
    env = gym.make(card["env_id"], **card["env_kwargs"])
    returns = []
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        state = np.zeros((1, inputs["state"]["shape"][1]), np.float32) if "state" in inputs else None
        total, done = 0.0, False
        while not done:
            feed = {name: np.asarray(leaf(obs, name), spec["dtype"])[None] for name, spec in inputs.items()
                    if name.startswith("obs")}
            if state is not None:
                feed["state"] = state
            got = dict(zip(outputs, session.run(outputs, feed)))
            state = got.get("state_out")
            action = got["action"][0]
            obs, reward, terminated, truncated, _ = env.step(action.item() if action.ndim == 0 else action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        obs, _ = env.reset()
    env.close()
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the .onnx file lockstep export wrote (its card beside it: MODEL.json)")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="seeds the env's first reset (as lockstep eval --seed)")
    args = parser.parse_args()
    returns = play(args.model, args.episodes, args.seed)
    print(json.dumps({"returns": returns, "return_mean": float(np.mean(returns))}))


if __name__ == "__main__":
    main()
