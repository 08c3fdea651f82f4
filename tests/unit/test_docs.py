"""The docs point at things that exist: every relative link (and its #anchor) and every path in backticks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "benchmarks").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A path in backticks that names part of the tree: src/..., dev/..., tests/... (globs and placeholders aside).
TREE_PATH = re.compile(r"`((?:src|dev|tests)/[\w./-]*)`")
CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = CODE_BLOCK.sub("", path.read_text())
    anchors = set()
    for heading in re.findall(r"^#+\s+(.*)$", text, re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_relative_link_points_to_an_existing_file_and_heading(doc):
    text = CODE_BLOCK.sub("", doc.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target}: no file {_name(linked) if linked.is_relative_to(ROOT) else linked}")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: {_name(linked)} has no heading #{anchor}")
    assert not broken, f"{_name(doc)} links to what does not exist (fix the link or the heading): {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_path_of_the_tree_in_backticks_exists(doc):
    missing = [p for p in TREE_PATH.findall(doc.read_text()) if not (ROOT / p.rstrip("/")).exists()]
    assert not missing, f"{_name(doc)} names paths that are not in the tree (update them to today's): {missing}"


def test_the_protocol_page_names_every_message_field_and_refusal_status():
    """docs/protocol.md is the contract a client in another language is written from: every message and field of
    lockstep.proto, and every status the learner refuses with, must be on it (a new field needs its line there)."""
    from lockstep.transport import lockstep_pb2 as pb
    from lockstep.transport import protocol

    text = (ROOT / "docs" / "protocol.md").read_text()
    missing = [f"message {name}" for name in pb.DESCRIPTOR.message_types_by_name if name not in text]
    for message in pb.DESCRIPTOR.message_types_by_name.values():
        missing += [f"{message.name}.{field.name}" for field in message.fields if f"`{field.name}`" not in text]
    missing += [f"Space.Kind {kind.name}" for kind in pb.Space.Kind.DESCRIPTOR.values
                if kind.number and f"`{kind.name}`" not in text]
    codes = [value for name, value in vars(protocol).items() if name.isupper() and isinstance(value, str)]
    missing += [f"status {code}" for code in codes if f"`{code}`" not in text]
    assert not missing, f"docs/protocol.md does not describe: {missing}"
