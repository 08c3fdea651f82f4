"""Regenerate ``lockstep_pb2.py`` from ``lockstep.proto`` (``make proto``).

The generated module is committed so that a clone runs without protoc; the
test suite checks that it still matches the ``.proto`` file.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

PROTO = Path(__file__).with_name("lockstep.proto")
SRC_ROOT = PROTO.parents[2]


def generate(out_dir: Path) -> Path:
    """Run protoc on the .proto file and return the path of the generated module."""
    from grpc_tools import protoc

    rel = PROTO.relative_to(SRC_ROOT)
    code = protoc.main(["protoc", f"-I{SRC_ROOT}", f"--python_out={out_dir}", str(rel)])
    if code != 0:
        raise RuntimeError(f"protoc failed on {PROTO} (exit {code})")
    return out_dir / rel.with_name("lockstep_pb2.py")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        target = PROTO.with_name("lockstep_pb2.py")
        target.write_text(generated.read_text())
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
