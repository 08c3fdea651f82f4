"""The imports between lockstep's packages, read from the source: what test_boundaries.py checks the order of.

    python tests/package_graph.py [SRC]    # each package and the packages it imports (SRC: src/lockstep)

Every import counts, at module level or inside a function (a deferred import is still a dependency), and
so does ``lockstep.config`` and the other top-level modules (``cli``, ``api``), each a package of its own.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "lockstep"


def package_of(path: Path, src: Path = SRC) -> str:
    """``learner`` for src/lockstep/learner/trainer.py, ``config`` for src/lockstep/config.py."""
    first = path.relative_to(src).parts[0]
    return first.removesuffix(".py")


def imports(src: Path = SRC) -> dict[tuple[str, str], list[str]]:
    """(package, package it imports) -> the files (relative to ``src``) that import it."""
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(src.rglob("*.py")):
        here = package_of(path, src)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] != "lockstep" or len(parts) < 2:
                    continue
                there = parts[1]
                if there != here and ((src / there).is_dir() or (src / f"{there}.py").exists()):
                    found[(here, there)].add(str(path.relative_to(src)))
    return {edge: sorted(files) for edge, files in sorted(found.items())}


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else SRC
    edges = imports(src)
    by_package: dict[str, list[str]] = defaultdict(list)
    for here, there in edges:
        by_package[here].append(there)
    for here in sorted(by_package):
        print(f"{here:10} -> {' '.join(by_package[here])}")
    both = sorted((a, b) for a, b in edges if a < b and (b, a) in edges)
    print("import each other:", ", ".join(f"{a} <-> {b}" for a, b in both) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
