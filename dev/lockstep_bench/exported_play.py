"""Run exported policies in a real runtime, in a process that never imports lockstep.

    python exported_play.py JOBS.json

JOBS.json lists ``{"format": "onnx" | "torchscript", "file": FILE, "inputs": IN.npz, "outputs": OUT.npz}``. Each
IN.npz holds every input of the file's card (FILE.json) but ``state``, stacked over steps: [T, B, ...], and
``_starts`` [T, B] (where episodes start). The steps run in order, a recurrent policy's ``state`` zeroed where
episodes start and else carried from its ``state_out``; OUT.npz gets every output of the card, [T, B, ...].
Prints the names of the modules ``lockstep*`` loaded (none): ``lockstep_bench.parity`` runs it so, and in
process (``run``).
"""

from __future__ import annotations

import json
import sys

import numpy as np


def run(fmt: str, path: str, steps: dict[str, np.ndarray], card: dict) -> dict[str, list[np.ndarray]]:
    """The outputs of the file at ``path`` for the inputs ``steps`` (module docstring), step by step."""
    inputs = [i["name"] for i in card["inputs"]]
    outputs = [o["name"] for o in card["outputs"]]
    starts = steps["_starts"]
    T, B = starts.shape
    state_size = next((i["shape"][1] for i in card["inputs"] if i["name"] == "state"), 0)
    state = np.zeros((B, state_size), np.float32)
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == inputs, session.get_inputs()

        def call(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            return session.run(outputs, feed)
    else:
        import torch

        module = torch.jit.load(path)

        def call(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            with torch.no_grad():
                out = module(*[torch.from_numpy(feed[name]) for name in inputs])
            return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]
    got: dict[str, list[np.ndarray]] = {name: [] for name in outputs}
    for t in range(T):
        feed = {name: np.ascontiguousarray(steps[name][t]) for name in inputs if name != "state"}
        if state_size:
            feed["state"] = np.where(starts[t][:, None], np.float32(0), state)
        for name, value in zip(outputs, call(feed)):
            got[name].append(value)
        if state_size:
            state = got["state_out"][-1]
    return got


def main(jobs_file: str) -> None:
    for job in json.loads(open(jobs_file).read()):
        card = json.loads(open(job["file"] + ".json").read())
        with np.load(job["inputs"]) as data:
            steps = {name: data[name] for name in data.files}
        got = run(job["format"], job["file"], steps, card)
        np.savez(job["outputs"], **{name: np.stack(values) for name, values in got.items()})
    print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] == "lockstep")))


if __name__ == "__main__":
    main(sys.argv[1])
