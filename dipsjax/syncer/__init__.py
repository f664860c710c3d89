"""The syncer's sans-IO protocol core: leader and follower state machines, typed messages,
grace policies, communication schedule and placement, event tape and token ledger, and the
method registry (DESIGN.md sec. 2-3).

The leader side (:mod:`.leader`, :mod:`.messages`, :mod:`.grace`, :mod:`.schedule`,
:mod:`.tape`, :mod:`.methods`) imports no JAX; :class:`Follower` (which runs the outer chain)
does, and is loaded on first use (PEP 562), so a leader process stays JAX-free.
"""

import importlib
from typing import Any

from dipsjax.syncer import messages
from dipsjax.syncer.grace import (
    DynamicGrace,
    FixedGrace,
    GracePolicy,
    NoGrace,
    QuorumGrace,
    make_grace,
    optimal_grace,
)
from dipsjax.syncer.leader import Leader, LeaderConfig
from dipsjax.syncer.schedule import (
    Schedule,
    Transfer,
    assign_layers,
    follower_loads,
    greedy_schedule,
    optimal_schedule,
    place_ps,
    schedule_lower_bound,
    transfer_time,
)
from dipsjax.syncer.tape import EventTape, RoundRecord, TokenLedger

_LAZY = {"Follower": "follower", "FollowerState": "follower"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"dipsjax.syncer.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'dipsjax.syncer' has no attribute {name!r}")


__all__ = [
    "DynamicGrace",
    "EventTape",
    "FixedGrace",
    "Follower",
    "FollowerState",
    "GracePolicy",
    "Leader",
    "LeaderConfig",
    "NoGrace",
    "QuorumGrace",
    "RoundRecord",
    "Schedule",
    "TokenLedger",
    "Transfer",
    "assign_layers",
    "follower_loads",
    "greedy_schedule",
    "make_grace",
    "messages",
    "optimal_grace",
    "optimal_schedule",
    "place_ps",
    "schedule_lower_bound",
    "transfer_time",
]
