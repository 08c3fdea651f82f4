"""Symmetry reduction: a state's key up to renaming actors.

Actors are interchangeable -- the gate uses member ids only as dict keys and to
order its answers -- so states that differ only in which actor is which have the
same futures up to that renaming, and one of them stands for all (up to N! fewer
states). The canonical key attributes to each actor everything that names it and
sorts the actors' parts; two states get the same key exactly when one is the other
with actors renamed. Actors of different ``weights`` are never merged: the weight
is part of each actor's part.
"""

from __future__ import annotations

from typing import Any

from lockstep_verify.freeze import LOCK_TYPES, SCALARS, freeze, sorted_mixed
from lockstep_verify.state import ReleaseCallback, World


class Asymmetric(Exception):
    """The gate holds a member's name somewhere the canonical form cannot attribute it.

    The search then falls back to the plain key for that state, which is always sound.
    """


def canonical_key(gate: Any, world: World, index: dict[str, int], weights: tuple[int, ...] | None) -> tuple:
    """The state's key up to renaming actors: a global part and the sorted per-actor parts.

    Everything that names a member -- a key of a dict of the gate (its entry, its held
    callback), a key or element of a dict or set inside one of the gate's objects (the
    phases it completed), the world's entries for it -- is attributed to that member.
    ``index`` maps member names to actor numbers. Raises :class:`Asymmetric` for
    shapes it cannot attribute.
    """
    mine: list[list[Any]] = [[] for _ in world.actors]
    shared: list[Any] = []
    for attr, x in gate.__dict__.items():
        t = type(x)
        if t in SCALARS:
            shared.append(x)
        elif t in LOCK_TYPES:
            continue
        elif t is dict:
            others = []
            for key, v in x.items():
                if type(key) is str:
                    mine[_actor(key, index)].append((attr, _plain(v)))
                elif type(key) in SCALARS:
                    others.append((key, _attribute_parts(attr, key, v, mine, index)))
                else:
                    raise Asymmetric(key)
            shared.append((attr, tuple(sorted_mixed(others))))
        elif t is set or t is frozenset:
            for m in x:
                mine[_actor(m, index)].append((attr,))
        else:
            shared.append((attr, _plain(x)))
    for c in world.completed:
        mine[c.actor].append(("completed", c.phase, c.samples))
    for position, batch in enumerate(world.queue):
        for c in batch.unrolls:
            mine[c.actor].append(("queue", position, (c.phase, c.samples)))
    actors = []
    for a, s in enumerate(world.actors):
        own = (weights[a] if weights else 1, s.status, s.joins_left, s.unroll or (), s.pending or (),
               -1 if s.held is None else s.held.session)
        actors.append((own,) + tuple(sorted_mixed(mine[a])))
    return (("sym",) + tuple(shared) + (tuple(batch.phase for batch in world.queue),)
            + (world.closed_next, world.published, world.snapshot, world.pending, world.trained, world.finished)
            + tuple(sorted_mixed(actors)))


def _actor(name: Any, index: dict[str, int]) -> int:
    """The actor a member name denotes; Asymmetric if ``name`` is not one."""
    a = index.get(name) if type(name) is str else None
    if a is None:
        raise Asymmetric(name)
    return a


def _attribute_parts(attr: str, key: Any, obj: Any, mine: list[list[Any]], index: dict[str, int]) -> Any:
    """An object kept under a non-member key (a phase): attribute its member-keyed parts to their members.

    Returns the object's image with those parts replaced by placeholders.
    """
    d = getattr(obj, "__dict__", None)
    if d is None or callable(obj):
        return _plain(obj)
    out = []
    for f, v in d.items():
        t = type(v)
        if t is dict and all(type(m) is str for m in v):
            for m, w in v.items():
                mine[_actor(m, index)].append((attr, key, f, _plain(w)))
            out.append((f, "{}"))
        elif (t is set or t is frozenset) and all(type(m) is str for m in v):
            for m in v:
                mine[_actor(m, index)].append((attr, key, f))
            out.append((f, "set"))
        else:
            out.append((f, _plain(v)))
    return tuple(out)


def _plain(v: Any) -> Any:
    """Freeze a value that must not name a member (a callback stands for its session)."""
    t = type(v)
    if t in SCALARS:
        return v
    if t is ReleaseCallback:
        return ("release", v.session)
    d = getattr(v, "__dict__", None)
    if d is not None and all(type(x) in SCALARS for x in d.values()) and not callable(v):
        return (t.__name__,) + tuple(d.items())  # a plain record of numbers: names nobody
    if _may_name_a_member(v):
        raise Asymmetric(v)
    return freeze(v)


def _may_name_a_member(v: Any) -> bool:
    """Whether ``v`` holds a string (member names are the only strings) or something unknown."""
    t = type(v)
    if t is str:
        return True
    if t in SCALARS or t is ReleaseCallback or t in LOCK_TYPES:
        return False
    if t is dict:
        return any(_may_name_a_member(k) or _may_name_a_member(x) for k, x in v.items())
    if t in (set, frozenset, list, tuple):
        return any(_may_name_a_member(x) for x in v)
    d = getattr(v, "__dict__", None)
    if d is not None and not callable(v):
        return any(_may_name_a_member(x) for x in d.values())
    return True
