from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Join(_message.Message):
    __slots__ = ("t", "learner", "incarnation", "resume", "fingerprint", "session", "ends", "asks")
    T_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ENDS_FIELD_NUMBER: _ClassVar[int]
    ASKS_FIELD_NUMBER: _ClassVar[int]
    t: float
    learner: int
    incarnation: int
    resume: bool
    fingerprint: str
    session: int
    ends: int
    asks: int
    def __init__(self, t: _Optional[float] = ..., learner: _Optional[int] = ..., incarnation: _Optional[int] = ..., resume: _Optional[bool] = ..., fingerprint: _Optional[str] = ..., session: _Optional[int] = ..., ends: _Optional[int] = ..., asks: _Optional[int] = ...) -> None: ...

class Leave(_message.Message):
    __slots__ = ("t", "learner")
    T_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    t: float
    learner: int
    def __init__(self, t: _Optional[float] = ..., learner: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("t", "learner")
    T_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    t: float
    learner: int
    def __init__(self, t: _Optional[float] = ..., learner: _Optional[int] = ...) -> None: ...

class Tick(_message.Message):
    __slots__ = ("t",)
    T_FIELD_NUMBER: _ClassVar[int]
    t: float
    def __init__(self, t: _Optional[float] = ...) -> None: ...

class PushMeta(_message.Message):
    __slots__ = ("tokens", "steps", "base_version", "incarnation", "train_seconds", "pulled", "start_chunk", "start_offset", "spans")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PULLED_FIELD_NUMBER: _ClassVar[int]
    START_CHUNK_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    steps: int
    base_version: int
    incarnation: int
    train_seconds: float
    pulled: bool
    start_chunk: int
    start_offset: int
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    def __init__(self, tokens: _Optional[int] = ..., steps: _Optional[int] = ..., base_version: _Optional[int] = ..., incarnation: _Optional[int] = ..., train_seconds: _Optional[float] = ..., pulled: _Optional[bool] = ..., start_chunk: _Optional[int] = ..., start_offset: _Optional[int] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("chunk", "start", "end")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    start: int
    end: int
    def __init__(self, chunk: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class PushRequested(_message.Message):
    __slots__ = ("t", "learner", "meta", "session")
    T_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    t: float
    learner: int
    meta: PushMeta
    session: int
    def __init__(self, t: _Optional[float] = ..., learner: _Optional[int] = ..., meta: _Optional[_Union[PushMeta, _Mapping]] = ..., session: _Optional[int] = ...) -> None: ...

class TransferDone(_message.Message):
    __slots__ = ("t", "learner", "round_id", "incarnation")
    T_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    t: float
    learner: int
    round_id: int
    incarnation: int
    def __init__(self, t: _Optional[float] = ..., learner: _Optional[int] = ..., round_id: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class PullDone(_message.Message):
    __slots__ = ("t", "learner", "version", "rounds")
    T_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    t: float
    learner: int
    version: int
    rounds: int
    def __init__(self, t: _Optional[float] = ..., learner: _Optional[int] = ..., version: _Optional[int] = ..., rounds: _Optional[int] = ...) -> None: ...

class ChunkRequested(_message.Message):
    __slots__ = ("t", "learner")
    T_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    t: float
    learner: int
    def __init__(self, t: _Optional[float] = ..., learner: _Optional[int] = ...) -> None: ...

class LearnerFailed(_message.Message):
    __slots__ = ("t", "learner", "reason")
    T_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    t: float
    learner: int
    reason: str
    def __init__(self, t: _Optional[float] = ..., learner: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class FollowerNorms(_message.Message):
    __slots__ = ("t", "follower", "round_id", "sq_norms")
    T_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    SQ_NORMS_FIELD_NUMBER: _ClassVar[int]
    t: float
    follower: int
    round_id: int
    sq_norms: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, t: _Optional[float] = ..., follower: _Optional[int] = ..., round_id: _Optional[int] = ..., sq_norms: _Optional[_Iterable[float]] = ...) -> None: ...

class FollowerMerged(_message.Message):
    __slots__ = ("t", "follower", "round_id", "merged_sq_norm")
    T_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    MERGED_SQ_NORM_FIELD_NUMBER: _ClassVar[int]
    t: float
    follower: int
    round_id: int
    merged_sq_norm: float
    def __init__(self, t: _Optional[float] = ..., follower: _Optional[int] = ..., round_id: _Optional[int] = ..., merged_sq_norm: _Optional[float] = ...) -> None: ...

class FollowerApplied(_message.Message):
    __slots__ = ("t", "follower", "round_id", "version")
    T_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    t: float
    follower: int
    round_id: int
    version: int
    def __init__(self, t: _Optional[float] = ..., follower: _Optional[int] = ..., round_id: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class FollowerJoined(_message.Message):
    __slots__ = ("t", "follower", "version", "oldest", "address", "rounds")
    T_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OLDEST_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    t: float
    follower: int
    version: int
    oldest: int
    address: str
    rounds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, t: _Optional[float] = ..., follower: _Optional[int] = ..., version: _Optional[int] = ..., oldest: _Optional[int] = ..., address: _Optional[str] = ..., rounds: _Optional[_Iterable[int]] = ...) -> None: ...

class FollowerLost(_message.Message):
    __slots__ = ("t", "follower", "reason")
    T_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    t: float
    follower: int
    reason: str
    def __init__(self, t: _Optional[float] = ..., follower: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class FollowerHeartbeat(_message.Message):
    __slots__ = ("t", "follower")
    T_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    t: float
    follower: int
    def __init__(self, t: _Optional[float] = ..., follower: _Optional[int] = ...) -> None: ...

class SendModel(_message.Message):
    __slots__ = ("learner", "version", "leases", "last_round", "last_outcome", "booked", "steps", "session", "asked")
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    LAST_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    BOOKED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ASKED_FIELD_NUMBER: _ClassVar[int]
    learner: int
    version: int
    leases: _containers.RepeatedCompositeFieldContainer[Span]
    last_round: int
    last_outcome: str
    booked: int
    steps: int
    session: int
    asked: int
    def __init__(self, learner: _Optional[int] = ..., version: _Optional[int] = ..., leases: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., last_round: _Optional[int] = ..., last_outcome: _Optional[str] = ..., booked: _Optional[int] = ..., steps: _Optional[int] = ..., session: _Optional[int] = ..., asked: _Optional[int] = ...) -> None: ...

class Transfer(_message.Message):
    __slots__ = ("layer", "follower", "step")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    layer: int
    follower: int
    step: int
    def __init__(self, layer: _Optional[int] = ..., follower: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class PushShards(_message.Message):
    __slots__ = ("round_id", "learner", "transfers", "ticket")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    learner: int
    transfers: _containers.RepeatedCompositeFieldContainer[Transfer]
    ticket: str
    def __init__(self, round_id: _Optional[int] = ..., learner: _Optional[int] = ..., transfers: _Optional[_Iterable[_Union[Transfer, _Mapping]]] = ..., ticket: _Optional[str] = ...) -> None: ...

class WakeAt(_message.Message):
    __slots__ = ("t",)
    T_FIELD_NUMBER: _ClassVar[int]
    t: float
    def __init__(self, t: _Optional[float] = ...) -> None: ...

class RequestNorms(_message.Message):
    __slots__ = ("round_id", "learners", "base_versions")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    learners: _containers.RepeatedScalarFieldContainer[int]
    base_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, round_id: _Optional[int] = ..., learners: _Optional[_Iterable[int]] = ..., base_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class Decide(_message.Message):
    __slots__ = ("round_id", "learners", "accepted", "tokens", "steps", "weights", "sq_norms")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SQ_NORMS_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    learners: _containers.RepeatedScalarFieldContainer[int]
    accepted: _containers.RepeatedScalarFieldContainer[bool]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    steps: _containers.RepeatedScalarFieldContainer[int]
    weights: _containers.RepeatedScalarFieldContainer[float]
    sq_norms: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, round_id: _Optional[int] = ..., learners: _Optional[_Iterable[int]] = ..., accepted: _Optional[_Iterable[bool]] = ..., tokens: _Optional[_Iterable[int]] = ..., steps: _Optional[_Iterable[int]] = ..., weights: _Optional[_Iterable[float]] = ..., sq_norms: _Optional[_Iterable[float]] = ...) -> None: ...

class Apply(_message.Message):
    __slots__ = ("round_id", "version", "clip_factor", "merged_sq_norm")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIP_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MERGED_SQ_NORM_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    version: int
    clip_factor: float
    merged_sq_norm: float
    def __init__(self, round_id: _Optional[int] = ..., version: _Optional[int] = ..., clip_factor: _Optional[float] = ..., merged_sq_norm: _Optional[float] = ...) -> None: ...

class Discard(_message.Message):
    __slots__ = ("round_id", "reason")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    reason: str
    def __init__(self, round_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class NotifyPull(_message.Message):
    __slots__ = ("round_id", "learners", "version", "outcomes", "steps")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    learners: _containers.RepeatedScalarFieldContainer[int]
    version: int
    outcomes: _containers.RepeatedScalarFieldContainer[str]
    steps: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, round_id: _Optional[int] = ..., learners: _Optional[_Iterable[int]] = ..., version: _Optional[int] = ..., outcomes: _Optional[_Iterable[str]] = ..., steps: _Optional[_Iterable[int]] = ...) -> None: ...

class GrantChunk(_message.Message):
    __slots__ = ("learner", "chunk", "start", "end")
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    learner: int
    chunk: int
    start: int
    end: int
    def __init__(self, learner: _Optional[int] = ..., chunk: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Evict(_message.Message):
    __slots__ = ("learner", "reason", "incarnation", "kind")
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    learner: int
    reason: str
    incarnation: int
    kind: str
    def __init__(self, learner: _Optional[int] = ..., reason: _Optional[str] = ..., incarnation: _Optional[int] = ..., kind: _Optional[str] = ...) -> None: ...

class Refuse(_message.Message):
    __slots__ = ("learner", "reason", "kind", "incarnation")
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    learner: int
    reason: str
    kind: str
    incarnation: int
    def __init__(self, learner: _Optional[int] = ..., reason: _Optional[str] = ..., kind: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class Unused(_message.Message):
    __slots__ = ("learner", "round_id", "kind", "reason", "incarnation")
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    learner: int
    round_id: int
    kind: str
    reason: str
    incarnation: int
    def __init__(self, learner: _Optional[int] = ..., round_id: _Optional[int] = ..., kind: _Optional[str] = ..., reason: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class Rejoin(_message.Message):
    __slots__ = ("follower", "reason")
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    follower: int
    reason: str
    def __init__(self, follower: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Stop(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("job_token", "join", "leave", "heartbeat", "tick", "push_requested", "transfer_done", "pull_done", "chunk_requested", "learner_failed", "follower_norms", "follower_merged", "follower_applied", "follower_joined", "follower_lost", "send_model", "push_shards", "wake_at", "request_norms", "decide", "apply", "discard", "notify_pull", "grant_chunk", "evict", "refuse", "stop", "follower_heartbeat", "unused", "rejoin", "epoch", "seq", "acked", "incarnation", "session", "request")
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TICK_FIELD_NUMBER: _ClassVar[int]
    PUSH_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_DONE_FIELD_NUMBER: _ClassVar[int]
    PULL_DONE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FAILED_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_NORMS_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_MERGED_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_APPLIED_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_JOINED_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_LOST_FIELD_NUMBER: _ClassVar[int]
    SEND_MODEL_FIELD_NUMBER: _ClassVar[int]
    PUSH_SHARDS_FIELD_NUMBER: _ClassVar[int]
    WAKE_AT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_NORMS_FIELD_NUMBER: _ClassVar[int]
    DECIDE_FIELD_NUMBER: _ClassVar[int]
    APPLY_FIELD_NUMBER: _ClassVar[int]
    DISCARD_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_PULL_FIELD_NUMBER: _ClassVar[int]
    GRANT_CHUNK_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    REFUSE_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    UNUSED_FIELD_NUMBER: _ClassVar[int]
    REJOIN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    job_token: str
    join: Join
    leave: Leave
    heartbeat: Heartbeat
    tick: Tick
    push_requested: PushRequested
    transfer_done: TransferDone
    pull_done: PullDone
    chunk_requested: ChunkRequested
    learner_failed: LearnerFailed
    follower_norms: FollowerNorms
    follower_merged: FollowerMerged
    follower_applied: FollowerApplied
    follower_joined: FollowerJoined
    follower_lost: FollowerLost
    send_model: SendModel
    push_shards: PushShards
    wake_at: WakeAt
    request_norms: RequestNorms
    decide: Decide
    apply: Apply
    discard: Discard
    notify_pull: NotifyPull
    grant_chunk: GrantChunk
    evict: Evict
    refuse: Refuse
    stop: Stop
    follower_heartbeat: FollowerHeartbeat
    unused: Unused
    rejoin: Rejoin
    epoch: int
    seq: int
    acked: int
    incarnation: int
    session: int
    request: int
    def __init__(self, job_token: _Optional[str] = ..., join: _Optional[_Union[Join, _Mapping]] = ..., leave: _Optional[_Union[Leave, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., tick: _Optional[_Union[Tick, _Mapping]] = ..., push_requested: _Optional[_Union[PushRequested, _Mapping]] = ..., transfer_done: _Optional[_Union[TransferDone, _Mapping]] = ..., pull_done: _Optional[_Union[PullDone, _Mapping]] = ..., chunk_requested: _Optional[_Union[ChunkRequested, _Mapping]] = ..., learner_failed: _Optional[_Union[LearnerFailed, _Mapping]] = ..., follower_norms: _Optional[_Union[FollowerNorms, _Mapping]] = ..., follower_merged: _Optional[_Union[FollowerMerged, _Mapping]] = ..., follower_applied: _Optional[_Union[FollowerApplied, _Mapping]] = ..., follower_joined: _Optional[_Union[FollowerJoined, _Mapping]] = ..., follower_lost: _Optional[_Union[FollowerLost, _Mapping]] = ..., send_model: _Optional[_Union[SendModel, _Mapping]] = ..., push_shards: _Optional[_Union[PushShards, _Mapping]] = ..., wake_at: _Optional[_Union[WakeAt, _Mapping]] = ..., request_norms: _Optional[_Union[RequestNorms, _Mapping]] = ..., decide: _Optional[_Union[Decide, _Mapping]] = ..., apply: _Optional[_Union[Apply, _Mapping]] = ..., discard: _Optional[_Union[Discard, _Mapping]] = ..., notify_pull: _Optional[_Union[NotifyPull, _Mapping]] = ..., grant_chunk: _Optional[_Union[GrantChunk, _Mapping]] = ..., evict: _Optional[_Union[Evict, _Mapping]] = ..., refuse: _Optional[_Union[Refuse, _Mapping]] = ..., stop: _Optional[_Union[Stop, _Mapping]] = ..., follower_heartbeat: _Optional[_Union[FollowerHeartbeat, _Mapping]] = ..., unused: _Optional[_Union[Unused, _Mapping]] = ..., rejoin: _Optional[_Union[Rejoin, _Mapping]] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., acked: _Optional[int] = ..., incarnation: _Optional[int] = ..., session: _Optional[int] = ..., request: _Optional[int] = ...) -> None: ...

class Replies(_message.Message):
    __slots__ = ("actions", "error", "refused", "epoch")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[Envelope]
    error: str
    refused: str
    epoch: int
    def __init__(self, actions: _Optional[_Iterable[_Union[Envelope, _Mapping]]] = ..., error: _Optional[str] = ..., refused: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("job_token", "learner", "follower", "incarnation", "acked", "epoch")
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    job_token: str
    learner: int
    follower: int
    incarnation: int
    acked: int
    epoch: int
    def __init__(self, job_token: _Optional[str] = ..., learner: _Optional[int] = ..., follower: _Optional[int] = ..., incarnation: _Optional[int] = ..., acked: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("job_token",)
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_token: str
    def __init__(self, job_token: _Optional[str] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
