"""The control plane's codec: :mod:`dipsjax.syncer.messages` <-> protobuf (``proto/syncer.proto``).

Every event and action class maps one to one onto the protobuf message of the same name,
field for field, and travels inside an :class:`Envelope <syncer_pb2.Envelope>` whose
``oneof message`` names the class in snake_case (``PushRequested`` -> ``push_requested``).
The mapping is table-driven: it is derived from the dataclasses' type hints and checked
against the protobuf descriptors when this module is imported, so a class added to
``messages.MESSAGES`` without its protobuf message (or a field that differs in name, type,
repetition or optionality) fails loudly at import.

* Python ``int`` <-> ``int64`` (range-checked), ``float`` <-> ``double`` (bit for bit:
  NaN, +-inf and -0.0 round-trip), ``bool`` <-> ``bool``, ``str`` <-> ``string``,
  ``tuple`` <-> ``repeated``, ``X | None`` <-> proto3 ``optional`` (unset is ``None``).
  Every field is always written, so ``decode(encode(m)) == m`` exactly (the Python defaults
  never stand in for a missing wire field).
* Ids (``learner``, ``follower``, ``round_id``, ``version``, ``incarnation``, chunks,
  offsets, ``Transfer.layer``/``step``...) must be >= 0, checked on both ways. Counts
  (``tokens``, ``steps``) pass through signed: the leader refuses such a push itself.
* ``Decide``'s per-learner tuples must all have the same length.
* Bad input -- not protobuf, an empty or unknown ``oneof``, a field of the wrong type (in
  Python, or on the wire), a negative id, an out-of-range int -- raises ``ValueError``
  naming the problem, never a protobuf exception.

The envelope's ``job_token`` is the per-job credential: :func:`to_proto`/:func:`encode` set
it, :func:`from_proto`/:func:`decode` ignore it (the runtime checks it on the
:class:`Envelope` itself, e.g. via :func:`parse_envelope`). Never log it; :func:`redacted`
gives a loggable copy.

Leader-side: imports no JAX (only the protobuf runtime and the JAX-free syncer messages).
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
import re
import types
import typing
from typing import Any

from google.protobuf import message as _pb_message
from google.protobuf import unknown_fields as _unknown_fields
from google.protobuf.descriptor import FieldDescriptor

from dipsjax.syncer import messages as m
from dipsjax.transport.proto import syncer_pb2

__all__ = [
    "MESSAGE_TYPES",
    "NONNEGATIVE_FIELDS",
    "Envelope",
    "case_name",
    "decode",
    "encode",
    "from_proto",
    "parse_envelope",
    "redacted",
    "to_proto",
]

Envelope = syncer_pb2.Envelope
Message = m.Event | m.Action

#: Fields (by name, in any class, nested ones included) that hold ids, versions, chunk
#: numbers or offsets and so must be >= 0 (each element, for tuples).
NONNEGATIVE_FIELDS = frozenset(
    {
        "learner",
        "follower",
        "round_id",
        "version",
        "incarnation",
        "asks",
        "asked",
        "base_version",
        "base_versions",
        "learners",
        "start_chunk",
        "start_offset",
        "chunk",
        "start",
        "end",
        "layer",
        "step",
    }
)

_ONEOF = "message"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_PB_TYPE = {
    int: FieldDescriptor.TYPE_INT64,
    float: FieldDescriptor.TYPE_DOUBLE,
    bool: FieldDescriptor.TYPE_BOOL,
    str: FieldDescriptor.TYPE_STRING,
}
_WIRE_TYPE = {  # what a field of each protobuf type may arrive as (repeated: also packed)
    FieldDescriptor.TYPE_INT64: 0,
    FieldDescriptor.TYPE_BOOL: 0,
    FieldDescriptor.TYPE_DOUBLE: 1,
    FieldDescriptor.TYPE_STRING: 2,
    FieldDescriptor.TYPE_MESSAGE: 2,
}


def case_name(cls: type) -> str:
    """The Envelope ``oneof`` case of a message class: its name in snake_case."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


# ------------------------------------------------------------------------------ table


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    kind: type  # int, float, bool, str, or a nested dataclass (PushMeta, Transfer)
    repeated: bool
    optional: bool
    nonnegative: bool


@dataclasses.dataclass(frozen=True)
class _Spec:
    cls: type
    pb: type  # the generated protobuf class
    fields: tuple[_Field, ...]


def _field_of(name: str, hint: Any, owner: str) -> _Field:
    repeated = optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1 or len(typing.get_args(hint)) != 2:
            raise TypeError(f"{owner}.{name}: unsupported union {hint!r}")
        hint, optional = args[0], True
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{owner}.{name}: only tuple[X, ...] is supported, got {hint!r}")
        hint, repeated = args[0], True
    if hint not in _PB_TYPE and not dataclasses.is_dataclass(hint):
        raise TypeError(f"{owner}.{name}: unsupported type {hint!r}")
    return _Field(name, hint, repeated, optional, name in NONNEGATIVE_FIELDS)


def _spec_of(cls: type) -> _Spec:
    pb = getattr(syncer_pb2, cls.__name__, None)
    if pb is None:
        raise TypeError(f"syncer.proto has no message {cls.__name__}")
    hints = typing.get_type_hints(cls)
    fields = tuple(_field_of(f.name, hints[f.name], cls.__name__) for f in dataclasses.fields(cls))
    _check_against_descriptor(cls, pb, fields)
    return _Spec(cls, pb, fields)


def _check_against_descriptor(cls: type, pb: type, fields: tuple[_Field, ...]) -> None:
    desc = pb.DESCRIPTOR
    names = {f.name for f in fields}
    if set(desc.fields_by_name) != names:
        raise TypeError(
            f"{cls.__name__}: proto fields {sorted(desc.fields_by_name)} != "
            f"dataclass fields {sorted(names)}"
        )
    for f in fields:
        fd = desc.fields_by_name[f.name]
        where = f"{cls.__name__}.{f.name}"
        if f.kind in _PB_TYPE:
            ok = fd.type == _PB_TYPE[f.kind]
        else:
            ok = fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.name == (
                f.kind.__name__
            )
        if not ok:
            raise TypeError(f"{where}: proto type {fd.type} does not match {f.kind!r}")
        if fd.is_repeated != f.repeated:
            raise TypeError(f"{where}: repeated in proto {fd.is_repeated}, tuple {f.repeated}")
        scalar = f.kind in _PB_TYPE
        if scalar and not f.repeated and fd.has_presence != f.optional:
            raise TypeError(f"{where}: proto optional {fd.has_presence}, Python {f.optional}")
        if not scalar and f.optional:
            raise TypeError(f"{where}: optional nested messages are not supported")


def _build_table() -> tuple[dict[type, _Spec], dict[type, str], dict[str, type]]:
    specs: dict[type, _Spec] = {}
    todo = list(m.MESSAGES.values())
    while todo:
        cls = todo.pop()
        if cls in specs:
            continue
        specs[cls] = spec = _spec_of(cls)
        todo.extend(f.kind for f in spec.fields if dataclasses.is_dataclass(f.kind))
    oneof = Envelope.DESCRIPTOR.oneofs_by_name[_ONEOF]
    cases = {fd.name: fd for fd in oneof.fields}
    case_of = {cls: case_name(cls) for cls in m.MESSAGES.values()}
    if set(cases) != set(case_of.values()):
        raise TypeError(
            f"Envelope.{_ONEOF} cases {sorted(cases)} != messages {sorted(case_of.values())}"
        )
    for cls, case in case_of.items():
        if cases[case].message_type.name != cls.__name__:
            raise TypeError(f"Envelope.{case} holds {cases[case].message_type.name}")
    return specs, case_of, {case: cls for cls, case in case_of.items()}


_SPECS, _CASE_OF, _CLASS_OF = _build_table()

#: The event and action classes the codec maps (exactly ``messages.MESSAGES``' values).
MESSAGE_TYPES: tuple[type, ...] = tuple(m.MESSAGES.values())


# ----------------------------------------------------------------------------- checks


def _int(value: Any, where: str, nonnegative: bool) -> int:
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ValueError(f"{where}: expected an int, got {type(value).__name__} {value!r}")
    value = operator.index(value)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{where}: {value} does not fit in int64")
    if nonnegative and value < 0:
        raise ValueError(f"{where}: must be >= 0, got {value}")
    return value


def _float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: expected a float, got {type(value).__name__} {value!r}")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b":
        return bool(value)
    raise ValueError(f"{where}: expected a bool, got {type(value).__name__} {value!r}")


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a str, got {type(value).__name__} {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where}: not encodable as UTF-8 ({e.reason})") from None
    return value


def _scalar(f: _Field, value: Any, where: str) -> Any:
    if f.kind is int:
        return _int(value, where, f.nonnegative)
    if f.kind is float:
        return _float(value, where)
    if f.kind is bool:
        return _bool(value, where)
    return _str(value, where)


def _check_message(obj: Any, where: str) -> None:
    """Cross-field rules (both ways)."""
    if isinstance(obj, m.Decide):
        lengths = {
            name: len(getattr(obj, name))
            for name in ("learners", "accepted", "tokens", "steps", "weights", "sq_norms")
        }
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{where}: per-learner tuples differ in length: {lengths}")
    if isinstance(obj, m.Span) and not obj.start < obj.end:
        raise ValueError(f"{where}: start {obj.start} must be < end {obj.end}")
    if isinstance(obj, m.GrantChunk) and obj.chunk is not None and not obj.start < obj.end:
        raise ValueError(f"{where}: start {obj.start} must be < end {obj.end}")


# ------------------------------------------------------------------------ python -> pb


def _to_pb(obj: Any, spec: _Spec, where: str) -> Any:
    kwargs: dict[str, Any] = {}
    for f in spec.fields:
        value = getattr(obj, f.name)
        at = f"{where}.{f.name}"
        if f.optional and value is None:
            continue
        if f.repeated:
            if not isinstance(value, tuple):
                raise ValueError(f"{at}: expected a tuple, got {type(value).__name__}")
            kwargs[f.name] = [_one_to_pb(f, x, f"{at}[{i}]") for i, x in enumerate(value)]
        else:
            kwargs[f.name] = _one_to_pb(f, value, at)
    _check_message(obj, where)
    try:
        return spec.pb(**kwargs)
    except (TypeError, ValueError) as e:  # not expected after the checks above
        raise ValueError(f"{where}: {e}") from None


def _one_to_pb(f: _Field, value: Any, where: str) -> Any:
    if f.kind in _PB_TYPE:
        return _scalar(f, value, where)
    if type(value) is not f.kind:
        raise ValueError(
            f"{where}: expected a {f.kind.__name__}, got {type(value).__name__} {value!r}"
        )
    return _to_pb(value, _SPECS[f.kind], where)


def to_proto(message: Message, *, job_token: str = "") -> syncer_pb2.Envelope:
    """The :class:`Envelope` holding ``message`` (any class of :data:`MESSAGE_TYPES`).

    Raises ``ValueError`` for anything else, for a field of the wrong type, a negative id or
    an int outside int64.
    """
    cls = type(message)
    case = _CASE_OF.get(cls)
    if case is None:
        raise ValueError(f"not a syncer message: {cls.__module__}.{cls.__qualname__}")
    if not isinstance(job_token, str):
        raise ValueError(f"job_token: expected a str, got {type(job_token).__name__}")
    sub = _to_pb(message, _SPECS[cls], cls.__name__)
    return Envelope(job_token=job_token, **{case: sub})


def encode(message: Message, *, job_token: str = "") -> bytes:
    """``message`` as the serialized :class:`Envelope` (see :func:`to_proto`)."""
    return to_proto(message, job_token=job_token).SerializeToString()


# ------------------------------------------------------------------------ pb -> python


def _check_wire_types(msg: Any, where: str) -> None:
    """Protobuf parks a known field that arrived with the wrong wire type among the unknown
    fields (and leaves the field at its default): report it instead. Unknown field numbers
    (from a newer schema) are ignored."""
    by_number = msg.DESCRIPTOR.fields_by_number
    for u in _unknown_fields.UnknownFieldSet(msg):
        fd = by_number.get(u.field_number)
        if fd is not None:
            expected = _WIRE_TYPE.get(fd.type, "?")
            packed = " or 2 (packed)" if fd.is_repeated and expected != 2 else ""
            raise ValueError(
                f"{where}.{fd.name}: wrong wire type {u.wire_type} (expected {expected}{packed})"
            )


def _from_pb(pb: Any, spec: _Spec, where: str) -> Any:
    _check_wire_types(pb, where)
    kwargs: dict[str, Any] = {}
    for f in spec.fields:
        at = f"{where}.{f.name}"
        if f.repeated:
            kwargs[f.name] = tuple(
                _one_from_pb(f, x, f"{at}[{i}]") for i, x in enumerate(getattr(pb, f.name))
            )
        elif f.kind not in _PB_TYPE and not pb.HasField(f.name):
            raise ValueError(f"{at}: missing ({f.kind.__name__} is required)")
        elif f.optional and not pb.HasField(f.name):
            kwargs[f.name] = None
        else:
            kwargs[f.name] = _one_from_pb(f, getattr(pb, f.name), at)
    obj = spec.cls(**kwargs)
    _check_message(obj, where)
    return obj


def _one_from_pb(f: _Field, value: Any, where: str) -> Any:
    if f.kind in _PB_TYPE:
        return _scalar(f, value, where)  # the types hold; this checks ids >= 0
    return _from_pb(value, _SPECS[f.kind], where)


def from_proto(envelope: syncer_pb2.Envelope) -> Message:
    """The event or action inside ``envelope`` (its ``job_token`` is not looked at).

    Raises ``ValueError`` for an empty ``oneof``, a field that arrived with the wrong wire
    type, a missing required sub-message, a negative id or mismatched ``Decide`` lengths.
    """
    if not isinstance(envelope, Envelope):
        raise ValueError(f"expected a syncer_pb2.Envelope, got {type(envelope).__name__}")
    _check_wire_types(envelope, "Envelope")
    case = envelope.WhichOneof(_ONEOF)
    if case is None:
        raise ValueError(
            "Envelope holds no message (empty oneof, or a message type this version does not know)"
        )
    cls = _CLASS_OF[case]
    return _from_pb(getattr(envelope, case), _SPECS[cls], cls.__name__)


def parse_envelope(data: bytes | bytearray | memoryview) -> syncer_pb2.Envelope:
    """Parse serialized bytes into an :class:`Envelope` (nothing else checked); ``ValueError``
    when they are not a valid protobuf Envelope."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ValueError(f"expected bytes, got {type(data).__name__}")
    envelope = Envelope()
    try:
        envelope.ParseFromString(bytes(data))
    except _pb_message.DecodeError as e:
        raise ValueError(f"not a protobuf Envelope ({len(data)} bytes): {e}") from None
    return envelope


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Inverse of :func:`encode`: ``decode(encode(m)) == m`` for every valid message."""
    return from_proto(parse_envelope(data))


def redacted(envelope: syncer_pb2.Envelope) -> syncer_pb2.Envelope:
    """A copy of ``envelope`` safe to log: a set ``job_token`` is replaced by ``"<redacted>"``."""
    copy = Envelope()
    copy.CopyFrom(envelope)
    if copy.job_token:
        copy.job_token = "<redacted>"
    return copy
