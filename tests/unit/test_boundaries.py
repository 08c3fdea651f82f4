"""The boundaries of docs/architecture.md, checked in fresh interpreters and on the source tree."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "lockstep"


def _imported_after(module: str) -> set[str]:
    """Top-level packages loaded by importing ``module`` in a fresh interpreter."""
    code = f"import sys, {module}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("module", ["lockstep.actor", "lockstep.client", "lockstep.common.backoff", "lockstep.envs",
                                    "lockstep.transport.grpc.client", "lockstep.transport.shm.client"])
def test_the_actor_side_imports_no_torch(module):
    assert "torch" not in _imported_after(module)


def test_an_actor_stepping_a_minigrid_env_imports_no_torch():
    pytest.importorskip("minigrid")
    code = ("import sys; from lockstep.envs import make_vector_env; "
            "envs = make_vector_env('minigrid:MiniGrid-DoorKey-5x5-v0', 2); envs.reset(seed=1); envs.step([0, 1]); "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "minigrid" in loaded and "torch" not in loaded


@pytest.mark.parametrize("env_id, package", [("pettingzoo:mpe2.simple_spread_v3", "mpe2"),
                                             ("pettingzoo:lockstep.envs.departures", "lockstep"),
                                             ("pettingzoo:pettingzoo.classic.connect_four_v3", "pettingzoo")])
def test_an_actor_stepping_a_pettingzoo_env_imports_no_torch(env_id, package):
    pytest.importorskip(package)
    code = ("import sys; import numpy as np; from lockstep.envs import make_vector_env; "
            f"envs = make_vector_env({env_id!r}, 2); envs.reset(seed=list(range(envs.num_envs))); "
            "[envs.step(np.zeros(envs.num_envs, np.int64)) for _ in range(30)]; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert package in loaded and "torch" not in loaded


@pytest.mark.parametrize("module", ["lockstep.sync", "lockstep.sync.gate"])
def test_sync_imports_neither_torch_nor_grpc(module):
    loaded = _imported_after(module)
    assert "torch" not in loaded and "grpc" not in loaded


@pytest.mark.parametrize("path", ["ppo.py", "optim.py", "vtrace.py"])
def test_ppo_knows_nothing_of_transport_processes_or_versions(path):
    tree = ast.parse((SRC / "algo" / path).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for alias in node.names} | {node.module for node in ast.walk(tree)
                                         if isinstance(node, ast.ImportFrom) and node.module}
    assert not {n for n in names if n.split(".")[0] in ("grpc", "multiprocessing", "asyncio", "threading")}
    # the optimizer's step is the only other part of lockstep the update uses, and it uses none
    assert not {n for n in names if n.startswith("lockstep.") and n != "lockstep.algo.optim"}


def test_the_rollout_store_needs_no_torch():
    assert "torch" not in _imported_after("lockstep.learner.rollout")


@pytest.mark.parametrize("module", ["lockstep.sweep.runner", "lockstep.sweep.report"])
def test_a_sweep_runs_its_trials_as_processes_and_loads_neither_torch_nor_grpc(module):
    pytest.importorskip("optuna")
    assert not {"torch", "grpc"} & _imported_after(module)


def test_the_runtime_package_never_imports_the_benchmarks_or_the_model_checker():
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                assert name.split(".")[0] not in ("lockstep_bench", "lockstep_verify"), (
                    f"{path.relative_to(SRC)} imports {name}: the runtime must work without dev/ "
                    "(the benchmarks join the lockstep command through its entry points, cli.COMMANDS)")


# The order of the packages (docs/architecture.md): each imports only packages on the lines above its own.
ORDER = [
    {"common"},  # plumbing: atomic writes, backoff, trees of arrays, a process's parent
    {"envs", "sync"},  # env ids, spaces, the vector env; the admission gate
    {"algo", "transport"},  # PPO's math and statistics; the connection loop and its framings
    {"config"},  # the typed config tree
    {"models", "actor", "client", "observe"},  # policies; the actor, the external client; counters, metrics, plots
    {"learner"},  # the rooms of the learner and their wiring
    {"launch", "tools", "sweep"},  # who starts actors; eval and audit; sweeps of runs
    {"api", "cli"},  # what a user calls: the Python API and the command
    {"__main__", "__init__"},  # python -m lockstep; the package's own names
]


def test_each_package_imports_only_the_packages_below_it():
    from package_graph import imports

    level = {package: i for i, line in enumerate(ORDER) for package in line}
    edges = imports(SRC)
    unplaced = {package for edge in edges for package in edge} - set(level)
    assert not unplaced, f"packages missing from ORDER (place them in docs/architecture.md's order): {unplaced}"
    upward = [f"{here} imports {there} ({', '.join(files)})" for (here, there), files in edges.items()
              if level[there] >= level[here]]
    assert not upward, "imports that do not point down the order:\n" + "\n".join(upward)


def test_the_order_check_finds_an_import_that_points_up(tmp_path):
    from package_graph import imports

    (tmp_path / "observe").mkdir()
    (tmp_path / "learner").mkdir()
    (tmp_path / "observe" / "report.py").write_text("from lockstep.learner.trainer import Trainer\n")
    (tmp_path / "learner" / "wiring.py").write_text("def f():\n    from lockstep import observe\n")
    assert imports(tmp_path) == {("learner", "observe"): ["learner/wiring.py"],
                                 ("observe", "learner"): ["observe/report.py"]}


def test_the_learner_is_the_wiring_and_never_names_a_strategy():
    learner = (SRC / "learner" / "wiring.py").read_text()
    assert len(learner.splitlines()) <= 250
    for name in ("strict", "pipelined", "spin-flags", "spin-redo", "reject-retry", "seqlock"):
        assert f'"{name}"' not in learner, f"the learner branches on the strategy name {name}"
    assert "reference is None" not in learner and "batcher is None" not in learner
