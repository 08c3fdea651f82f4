"""Cloning, freezing and describing a gate by the shape of what it holds.

Nothing here depends on the gate's attribute names: a gate is cloned and frozen by
the shape of its attributes (dicts, sets, lists, plain objects, scalars), so the
checker keeps working as ``gate.py`` grows. The model names members "A0", "A1", ...
(strings, so that anything in the gate that names a member can be told from a phase
or a count: the symmetry reduction in ``symmetry.py`` relies on it).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from typing import Any

from lockstep_verify.state import ReleaseCallback

# A cloned gate gets fresh locks, made by these factories (lock types cannot be instantiated).
_NEW_LOCK = {type(threading.Lock()): threading.Lock, type(threading.RLock()): threading.RLock}
LOCK_TYPES = frozenset(_NEW_LOCK)
SCALARS = frozenset({int, float, bool, type(None)})
# Values that are copied and frozen as they are. Callbacks count: equal callbacks
# stand for the same held request.
ATOMIC = frozenset({int, float, str, bool, type(None), bytes, ReleaseCallback})

# The gate's parameters: left out of descriptions, which show how its state changed.
_CONSTANTS = frozenset({"steps_per_phase", "min_members", "max_lag", "cutoff", "min_cut_steps"})

# How _clone treats instances of each type it has met that is not a plain container.
_IMMUTABLE, _PLAIN_OBJECT, _OTHER = "immutable", "object", "other"
_CLONE_KIND: dict[type, str] = {}


def clone_gate(gate: Any) -> Any:
    """A copy of ``gate`` that shares nothing mutable with it (fresh locks; callbacks are kept)."""
    new = object.__new__(type(gate))
    new.__dict__.update({k: x if type(x) in ATOMIC else _clone(x) for k, x in gate.__dict__.items()})
    return new


def _clone(v: Any) -> Any:
    """A deep copy of gate state: containers and plain objects copied, locks renewed, callbacks kept."""
    t = type(v)
    if t in ATOMIC or t is tuple or t is frozenset:
        return v
    if t is dict:
        return {k: x if type(x) in ATOMIC else _clone(x) for k, x in v.items()}
    if t is set:
        return set(v)
    if t is list:
        return [_clone(x) for x in v]
    kind = _CLONE_KIND.get(t)
    if kind is None:
        kind = _CLONE_KIND[t] = _clone_kind(t, v)
    if kind == _PLAIN_OBJECT:
        new = object.__new__(t)
        new.__dict__.update({k: x if type(x) in ATOMIC else _clone(x) for k, x in v.__dict__.items()})
        return new
    if kind == _IMMUTABLE:
        return v
    if t in LOCK_TYPES:
        return _NEW_LOCK[t]()
    return copy.deepcopy(v)


def _clone_kind(t: type, v: Any) -> str:
    """Frozen dataclasses are shared; plain objects (a ``__dict__``, not callable) copied field by field."""
    if dataclasses.is_dataclass(t) and t.__dataclass_params__.frozen:
        return _IMMUTABLE
    if getattr(v, "__dict__", None) is not None and not callable(v) and not hasattr(t, "__slots__"):
        return _PLAIN_OBJECT
    return _OTHER


def gate_key(gate: Any) -> tuple:
    """The gate's internal state as a hashable tuple: every attribute but its locks, frozen.

    For AdmissionGate: started, published, next_close, members with their phase,
    steps, first phase (and budget, weight), held members with their callbacks, open
    phases with the members that completed them; plus the constants.
    """
    return tuple((k, x if type(x) in ATOMIC else freeze(x)) for k, x in gate.__dict__.items()
                 if type(x) not in LOCK_TYPES)


def freeze(v: Any) -> Any:
    """A hashable, canonical image of a value: dicts and sets sorted, objects by their attributes."""
    t = type(v)
    if t in ATOMIC:
        return v
    if t is dict:
        items = [(k, x if type(x) in ATOMIC else freeze(x)) for k, x in v.items()]
        return ("{}",) + tuple(sorted_mixed(items))
    if t is set or t is frozenset:
        return ("set",) + tuple(sorted_mixed([x if type(x) in ATOMIC else freeze(x) for x in v]))
    if t is list or t is tuple:
        return tuple(freeze(x) for x in v)
    if t in LOCK_TYPES:
        return None
    d = getattr(v, "__dict__", None)
    if d is not None and not callable(v):
        return (t.__name__,) + tuple((k, x if type(x) in ATOMIC else freeze(x)) for k, x in d.items())
    return repr(v)


def sorted_mixed(items: list) -> list:
    """``items`` sorted, by their repr if they cannot be compared (keys of mixed types)."""
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=repr)


def describe_gate(gate: Any) -> str:
    """The gate's state on one line (its constants left out), for violation messages."""

    def show(v: Any) -> str:
        d = getattr(v, "__dict__", None)
        if d is not None and not callable(v):
            return "(" + " ".join(f"{k}={show(x)}" for k, x in d.items()) + ")"
        if type(v) is dict:
            items = sorted(v.items(), key=lambda i: repr(i[0]))
            return "{" + ", ".join(f"{show(k)}: {show(x)}" for k, x in items) + "}"
        if type(v) in (set, frozenset):
            return "{" + ", ".join(sorted(map(show, v))) + "}"
        return str(v)

    return "gate: " + " ".join(f"{k.lstrip('_')}={show(x)}" for k, x in gate.__dict__.items()
                               if type(x) not in LOCK_TYPES and k not in _CONSTANTS)
