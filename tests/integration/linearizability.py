"""A small linearizability checker for one register per key (Wing & Gong's search with Porcupine's memoization).

An operation is ``Op(call, ret, kind, arg, out)``: ``call``/``ret`` are the client's invocation and completion
times; ``ret`` is ``math.inf`` when the outcome is unknown (an error that may or may not have taken effect; such
an operation may be linearized anywhere after its call, or never, which for a register is the same as last).

Kinds (the register's state is the key's value, None when absent; values are unique per write):
- ``write``: state = arg;
- ``delete``: state = None;
- ``cas``: arg = (expected, new); succeeded (out True): requires state == expected, then state = new;
  refused (out False): requires state != expected, no change;
- ``read``: requires state == out.

``check(ops)`` returns None when the history is linearizable, else a short description of the longest prefix it
could linearize. The search tries, at each step, every pending operation whose call precedes the earliest
completion among pending ones, and remembers (linearized set, state) pairs already explored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Op:
    call: float
    ret: float
    kind: str
    arg: Any = None
    out: Any = None
    client: int = 0


def _step(state: Any, op: Op) -> tuple[bool, Any]:
    if op.kind == "write":
        return True, op.arg
    if op.kind == "delete":
        return True, None
    if op.kind == "read":
        return state == op.out, state
    if op.kind == "cas":
        expected, new = op.arg
        if op.out is None:  # unknown outcome: either took effect (if it could) or not
            raise AssertionError("unknown CAS outcomes are expanded by check()")
        if op.out:
            return state == expected, new
        return state != expected, state
    raise ValueError(f"unknown op kind {op.kind!r}")


def check(ops: list[Op], init: Any = None, budget: int = 300_000) -> str | None:
    """None if ``ops`` (one key's history) is linearizable from ``init``; else what went wrong."""
    # An unknown CAS either succeeded or had no effect: a refused CAS's precondition is not known, so it is a
    # no-op that may be dropped; model it as a write that may happen (conditioned on state == expected).
    ops = sorted(ops, key=lambda o: o.call)
    n = len(ops)
    if n == 0:
        return None
    unknown = 0
    for i, op in enumerate(ops):
        if op.ret == math.inf:
            unknown |= 1 << i
    definite_full = ((1 << n) - 1) & ~unknown
    # Memo: (definite ops placed, state) -> masks of unknown ops used. A state that used a subset of the unknown
    # ops another used dominates it (an unknown op may always be left out), so the superset is pruned.
    seen: dict[tuple[int, Any], list[int]] = {}
    best = 0
    stack: list[tuple[int, Any]] = [(0, init)]
    steps = 0
    while stack:
        done, state = stack.pop()
        definite = done & definite_full
        if definite == definite_full:
            return None  # the unknown ops left may all be linearized last, or never
        used = done & unknown
        masks = seen.setdefault((definite, state), [])
        if any(m & ~used == 0 for m in masks):
            continue
        masks.append(used)
        steps += 1
        if steps > budget:
            raise RuntimeError("linearizability search budget exhausted")
        best = max(best, bin(definite).count("1"))
        pending = [i for i in range(n) if not done >> i & 1]
        horizon = min(ops[i].ret for i in pending)
        for i in pending:
            op = ops[i]
            if op.call > horizon:
                break
            if op.kind == "cas" and op.out is None:
                exp, new = op.arg
                if state == exp:
                    stack.append((done | 1 << i, new))
                continue
            if op.ret == math.inf:
                ok, nxt = _step(state, op)
                if ok and nxt != state:
                    stack.append((done | 1 << i, nxt))
                continue
            ok, nxt = _step(state, op)
            if ok:
                stack.append((done | 1 << i, nxt))
    first_bad = sorted(ops, key=lambda o: o.ret)[min(best, n - 1)]
    return f"not linearizable: {best} of {n} ops placed; stuck near {first_bad}"
