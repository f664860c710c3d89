"""The syncer's sans-IO protocol core: leader and follower state machines, grace policies,
communication schedule and placement, event tape and token ledger (DESIGN.md sec. 2-3)."""

from dipsjax.syncer.follower import Follower
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
from dipsjax.syncer.tape import EventTape, TokenLedger

__all__ = [
    "DynamicGrace",
    "EventTape",
    "FixedGrace",
    "Follower",
    "GracePolicy",
    "Leader",
    "LeaderConfig",
    "NoGrace",
    "QuorumGrace",
    "Schedule",
    "TokenLedger",
    "Transfer",
    "assign_layers",
    "follower_loads",
    "greedy_schedule",
    "make_grace",
    "optimal_grace",
    "optimal_schedule",
    "place_ps",
    "schedule_lower_bound",
    "transfer_time",
]
