"""The control plane's protobuf codec: exact round trips of every syncer message, ValueError on
bad input (never a protobuf exception), message sizes, and a JAX-free import."""

import dataclasses
import math
import pathlib
import re
import struct
import subprocess
import sys
import types
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax.syncer import messages as m
from dipsjax.transport import control_codec as c
from dipsjax.transport.proto import syncer_pb2 as pb

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAN, INF = math.nan, math.inf
NEG_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0001))[0]  # payload, sign

# One instance of every class, with non-default values (and optional fields both set and None).
EXAMPLES = [
    m.Join(
        1.25,
        learner=3,
        incarnation=2,
        resume=True,
        fingerprint="0123abcd4567ef89",
        session=21,
        ends=20,
        asks=1,
    ),
    m.Leave(2.5, learner=4),
    m.Heartbeat(3.0, learner=5),
    m.Tick(4.75),
    m.PushRequested(
        5.5,
        learner=6,
        meta=m.PushMeta(
            tokens=123_456_789,
            steps=50,
            base_version=7,
            incarnation=2,
            train_seconds=12.5,
            pulled=False,
            start_chunk=11,
            start_offset=4096,
            spans=(m.Span(11, 16, 32), m.Span(12, 0, 3)),
        ),
        session=17,
    ),
    m.PushRequested(-0.0, learner=0, meta=m.PushMeta(tokens=-1, steps=-2, base_version=0)),
    m.TransferDone(6.0, learner=7, round_id=8, incarnation=3),
    m.PullDone(6.5, learner=8, version=9, rounds=4),
    m.ChunkRequested(7.0, learner=9),
    m.LearnerFailed(7.5, learner=10, reason="oom: ünïcødé ✓"),
    m.FollowerNorms(8.0, follower=1, round_id=9, sq_norms=(1.0, NAN, INF, -INF, -0.0, 5e-324)),
    m.FollowerNorms(NAN, follower=2, round_id=9, sq_norms=(NEG_NAN,)),
    m.FollowerMerged(8.5, follower=2, round_id=9, merged_sq_norm=3.25),
    m.FollowerApplied(9.0, follower=3, round_id=9, version=10),
    m.FollowerJoined(9.5, follower=4, version=10, oldest=7, address="10.0.0.4:7003", rounds=(3, 4)),
    m.FollowerLost(10.0, follower=5, reason="timeout"),
    m.FollowerHeartbeat(10.5, follower=3),
    m.SendModel(
        learner=11,
        version=12,
        leases=(m.Span(4, 0, 8), m.Span(9, 3, 4)),
        last_round=3,
        last_outcome="dropped",
        booked=5,
        steps=24,
        session=9,
        asked=3,
    ),
    m.PushShards(
        round_id=13,
        learner=14,
        transfers=(m.Transfer(0, 1), m.Transfer(layer=5, follower=2, step=3)),
        ticket="00ff" * 8,
    ),
    m.WakeAt(INF),
    m.WakeAt(123.5),
    m.RequestNorms(round_id=15, learners=(1, 2, 3), base_versions=(7, 8, 9)),
    m.Decide(
        round_id=16,
        learners=(1, 2),
        accepted=(True, False),
        tokens=(100, 200),
        steps=(10, 20),
        weights=(0.5, 0.0),
        sq_norms=(1.5, NAN),
    ),
    m.Apply(round_id=17, version=18, clip_factor=0.75, merged_sq_norm=2.5),
    m.Discard(round_id=19, reason="all rejected"),
    m.NotifyPull(
        round_id=20,
        learners=(1, 2),
        version=21,
        outcomes=("applied", "stale"),
        steps=(16, 32),
    ),
    m.GrantChunk(learner=22, chunk=23, start=2, end=4),
    m.GrantChunk(learner=22, chunk=None),
    m.GrantChunk(learner=22, chunk=0, start=0, end=1),
    m.Evict(learner=24, reason="missed heartbeats", incarnation=2, kind="left"),
    m.Refuse(learner=25, reason="stale", kind="pending", incarnation=4),
    m.Unused(learner=26, round_id=4, kind="nonfinite", reason="squared norm nan", incarnation=2),
    m.Rejoin(follower=3, reason="found lost"),
    m.Stop(reason="budget reached"),
]


def same(a, b) -> bool:
    """Exact equality: same types all the way down; floats compared bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


# ------------------------------------------------------------------------- mapping


def test_every_message_class_is_mapped():
    assert set(c.MESSAGE_TYPES) == set(m.MESSAGES.values())
    assert len(c.MESSAGE_TYPES) == len(m.MESSAGES) == 29
    cases = {fd.name for fd in pb.Envelope.DESCRIPTOR.oneofs_by_name["message"].fields}
    assert cases == {c.case_name(cls) for cls in m.MESSAGES.values()}
    assert c.case_name(m.PushRequested) == "push_requested"


def test_table_check_fails_for_an_unmapped_class(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Bogus(m.Action):
        learner: int

    monkeypatch.setitem(m.MESSAGES, "Bogus", Bogus)
    with pytest.raises(TypeError, match="no message Bogus"):
        c._build_table()


def test_examples_cover_every_class_with_non_default_values():
    assert {type(x) for x in EXAMPLES} == set(m.MESSAGES.values())
    nested = [x.meta for x in EXAMPLES if isinstance(x, m.PushRequested)]
    nested += [t for x in EXAMPLES if isinstance(x, m.PushShards) for t in x.transfers]
    for cls in (*m.MESSAGES.values(), m.PushMeta, m.Transfer):
        instances = [x for x in EXAMPLES + nested if type(x) is cls]
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                assert any(getattr(x, f.name) != f.default for x in instances), (cls, f.name)


# ---------------------------------------------------------------------- round trips


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda x: type(x).__name__)
def test_every_message_round_trips_exactly(message):
    envelope = c.to_proto(message)
    assert envelope.WhichOneof("message") == c.case_name(type(message))
    assert same(c.from_proto(envelope), message)
    data = c.encode(message)
    assert isinstance(data, bytes)
    back = c.decode(data)
    assert same(back, message), (back, message)
    assert c.encode(back) == data
    assert same(c.decode(bytearray(data)), message)
    assert same(c.decode(memoryview(data)), message)


def test_optional_none_and_zero_are_distinct_on_the_wire():
    assert c.to_proto(m.GrantChunk(1, None)).grant_chunk.HasField("chunk") is False
    assert c.to_proto(m.GrantChunk(1, 0, 0, 1)).grant_chunk.HasField("chunk") is True
    assert c.decode(c.encode(m.GrantChunk(1, 0, 0, 1))).chunk == 0
    assert c.decode(c.encode(m.GrantChunk(1, None))).chunk is None
    meta = m.PushMeta(1, 1, 0, start_chunk=0)
    assert c.decode(c.encode(m.PushRequested(0.0, 1, meta))).meta.start_chunk == 0


def test_python_defaults_never_stand_in_for_wire_defaults():
    # PushMeta.pulled defaults to True in Python but False is proto3's default: it must
    # survive (the codec writes every field).
    meta = m.PushMeta(1, 1, 0, pulled=False)
    assert c.decode(c.encode(m.PushRequested(0.0, 1, meta))).meta.pulled is False
    assert c.decode(c.encode(m.PushRequested(0.0, 1, m.PushMeta(1, 1, 0)))).meta.pulled is True


def test_numpy_scalars_encode_as_plain_values():
    np = pytest.importorskip("numpy")
    message = m.Decide(
        1, (np.int64(2),), (np.bool_(True),), (np.int32(5),), (3,), (np.float32(0.5),), (1.0,)
    )
    back = c.decode(c.encode(message))
    assert same(back, m.Decide(1, (2,), (True,), (5,), (3,), (0.5,), (1.0,)))


def test_job_token_travels_on_the_envelope_and_can_be_redacted():
    data = c.encode(m.Heartbeat(1.0, 2), job_token="s3cret-token")
    envelope = c.parse_envelope(data)
    assert envelope.job_token == "s3cret-token"
    assert same(c.decode(data), m.Heartbeat(1.0, 2))
    shown = c.redacted(envelope)
    assert "s3cret" not in str(shown) and "s3cret" not in repr(shown)
    assert shown.job_token == "<redacted>" and envelope.job_token == "s3cret-token"
    assert c.redacted(c.to_proto(m.Tick(0.0))).job_token == ""


def test_unknown_fields_from_a_newer_schema_are_ignored():
    newer = pb.Join(t=1.0, learner=2, incarnation=3).SerializeToString() + bytes([0xA0, 0x06, 7])
    data = pb.Envelope(join=pb.Join.FromString(newer)).SerializeToString()
    assert same(c.decode(data), m.Join(1.0, 2, 3))


# ----------------------------------------------------------------- property tests

ids = st.integers(0, 2**63 - 1)
small_ids = st.integers(0, 1000)
counts = st.integers(-(2**63), 2**63 - 1)
bit_floats = st.integers(0, 2**64 - 1).map(lambda b: struct.unpack("<d", struct.pack("<Q", b))[0])
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), bit_floats)
texts = st.text(max_size=40)

push_metas = st.builds(
    m.PushMeta,
    tokens=counts,
    steps=counts,
    base_version=ids,
    incarnation=ids,
    train_seconds=floats,
    pulled=st.booleans(),
    start_chunk=st.none() | ids,
    start_offset=ids,
    spans=st.lists(
        st.tuples(ids, small_ids, small_ids).map(
            lambda t: m.Span(t[0], min(t[1], t[2]), max(t[1], t[2]) + 1)
        ),
        max_size=8,
    ).map(tuple),
)
push_requests = st.builds(m.PushRequested, t=floats, learner=ids, meta=push_metas)
push_shards = st.builds(
    m.PushShards,
    round_id=ids,
    learner=ids,
    transfers=st.lists(
        st.builds(m.Transfer, layer=ids, follower=small_ids, step=small_ids), max_size=20
    ).map(tuple),
)
follower_norms = st.builds(
    m.FollowerNorms,
    t=floats,
    follower=ids,
    round_id=ids,
    sq_norms=st.lists(floats, max_size=16).map(tuple),
)


@st.composite
def decides(draw):
    n = draw(st.integers(0, 16))

    def tup(elements):
        return tuple(draw(st.lists(elements, min_size=n, max_size=n)))

    return m.Decide(
        round_id=draw(ids),
        learners=tup(ids),
        accepted=tup(st.booleans()),
        tokens=tup(counts),
        steps=tup(counts),
        weights=tup(floats),
        sq_norms=tup(floats),
    )


def _strategy_for(cls):
    """Any valid instance of a message class, from its type hints (ids >= 0)."""
    if cls is m.Decide:
        return decides()
    if cls is m.Span:  # start < end
        return st.builds(lambda c, s, n: m.Span(c, s, s + n), ids, small_ids, st.integers(1, 64))
    if cls is m.GrantChunk:
        pieces = st.builds(
            lambda j, c, s, n: m.GrantChunk(j, c, s, s + n), ids, ids, small_ids, st.integers(1, 9)
        )
        return pieces | st.builds(m.GrantChunk, ids, st.none())
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        hint, optional = hints[f.name], False
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint, optional = next(a for a in typing.get_args(hint) if a is not type(None)), True
        repeated = typing.get_origin(hint) is tuple
        if repeated:
            hint = typing.get_args(hint)[0]
        base = {
            int: ids if f.name in c.NONNEGATIVE_FIELDS else counts,
            float: floats,
            bool: st.booleans(),
            str: texts,
        }.get(hint)
        if base is None:
            base = _strategy_for(hint)
        if repeated:
            base = st.lists(base, max_size=6).map(tuple)
        kwargs[f.name] = st.none() | base if optional else base
    return st.builds(cls, **kwargs)


any_message = st.sampled_from(sorted(m.MESSAGES.values(), key=lambda k: k.__name__)).flatmap(
    _strategy_for
)


@given(st.one_of(push_requests, decides(), push_shards, follower_norms))
def test_random_messages_round_trip(message):
    back = c.decode(c.encode(message))
    assert same(back, message), (back, message)


@given(any_message)
def test_random_instances_of_every_class_round_trip(message):
    assert same(c.decode(c.encode(message, job_token="tok")), message)


def _valid_or_value_error(data):
    try:
        message = c.decode(data)
    except ValueError:
        return
    assert type(message) in c.MESSAGE_TYPES
    assert same(c.decode(c.encode(message)), message)


@given(st.binary(max_size=256))
def test_fuzz_random_bytes_raise_only_value_error(data):
    _valid_or_value_error(data)


@given(
    st.sampled_from([c.encode(x, job_token="t") for x in EXAMPLES]),
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255), st.integers(0, 2)), max_size=6),
)
def test_fuzz_mutated_messages_raise_only_value_error(data, edits):
    buf = bytearray(data)
    for where, byte, op in edits:
        pos = where % (len(buf) + 1)
        if op == 0 and pos < len(buf):
            buf[pos] = byte
        elif op == 1:
            buf.insert(pos, byte)
        else:
            del buf[pos:]
    _valid_or_value_error(bytes(buf))


# --------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (m.PushMeta(1, 1, 0), "not a syncer message"),
        ({"type": "Join", "t": 0.0, "learner": 1}, "not a syncer message"),
        (m.Join(0.0, "3"), r"Join\.learner: expected an int"),
        (m.Join(0.0, True), r"Join\.learner: expected an int"),
        (m.Join(0.0, 2.0), r"Join\.learner: expected an int"),
        (m.Join(0.0, -1), r"Join\.learner: must be >= 0"),
        (m.Join(0.0, 1, incarnation=-3), r"Join\.incarnation: must be >= 0"),
        (m.Join(0.0, 2**63), "does not fit in int64"),
        (m.Join("now", 1), r"Join\.t: expected a float"),
        (m.Join(None, 1), r"Join\.t: expected a float"),
        (m.PushShards(1, 2, (m.Transfer(-1, 0),)), r"PushShards\.transfers\[0\]\.layer: must"),
        (m.PushShards(1, 2, (m.Transfer(0, 0), m.Transfer(1, 0, -2))), r"transfers\[1\]\.step"),
        (m.PushShards(1, 2, ((1, 2, 3),)), r"transfers\[0\]: expected a Transfer"),
        (m.PushShards(1, 2, [m.Transfer(0, 0)]), r"PushShards\.transfers: expected a tuple"),
        (m.PushRequested(0.0, 1, None), r"PushRequested\.meta: expected a PushMeta"),
        (
            m.PushRequested(0.0, 1, m.PushMeta(1, 1, 0, spans=(m.Span(1, 0, 1), m.Span(-2, 0, 1)))),
            r"meta\.spans\[1\]\.chunk: must be >= 0",
        ),
        (
            m.PushRequested(0.0, 1, m.PushMeta(1, 1, 0, spans=(m.Span(1, 2, 2),))),
            r"meta\.spans\[0\]: start 2 must be < end 2",
        ),
        (
            m.PushRequested(0.0, 1, m.PushMeta(1, 1, 0, spans=((1, 0, 1),))),
            r"meta\.spans\[0\]: expected a Span",
        ),
        (m.GrantChunk(1, 3, 1, 1), r"GrantChunk: start 1 must be < end 1"),
        (m.PushRequested(0.0, 1, m.PushMeta(1, 1, 0, start_chunk=-1)), "start_chunk: must be"),
        (m.FollowerNorms(0.0, 1, 2, ("x",)), r"sq_norms\[0\]: expected a float"),
        (m.FollowerNorms(0.0, 1, 2, 1.0), r"sq_norms: expected a tuple"),
        (m.Decide(1, (1, 2), (True,), (1, 2), (1, 2), (1.0, 2.0), (1.0, 2.0)), "differ in length"),
        (m.Decide(1, (1,), (1,), (1,), (1,), (1.0,), (1.0,)), r"accepted\[0\]: expected a bool"),
        (m.GrantChunk(1, -5), r"GrantChunk\.chunk: must be >= 0"),
        (m.LearnerFailed(0.0, 1, "\ud800"), r"LearnerFailed\.reason: not encodable"),
        (m.Stop(None), r"Stop\.reason: expected a str"),
    ],
)
def test_encode_rejects_bad_messages(message, match):
    with pytest.raises(ValueError, match=match):
        c.encode(message)


def test_encode_rejects_a_non_string_token():
    with pytest.raises(ValueError, match="job_token"):
        c.encode(m.Tick(0.0), job_token=b"bytes")


def _env(**kw):
    return pb.Envelope(**kw).SerializeToString()


def _tag(field, wire):
    key, out = field << 3 | wire, bytearray()
    while key > 0x7F:
        out.append(key & 0x7F | 0x80)
        key >>= 7
    return bytes([*out, key])


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "holds no message"),
        (_env(job_token="tok"), "holds no message"),
        (_tag(55, 0) + b"\x01", "holds no message"),  # a field (message type) it lacks
        (b"\xff\xff\xff\xff", "not a protobuf Envelope"),
        (b"\x12\x05\x08", "not a protobuf Envelope"),  # truncated
        (_tag(27, 2) + b"\x03" + _tag(1, 2) + b"\x01\xff", "not a protobuf"),  # bad UTF-8
        (_env(join=pb.Join(t=1.0, learner=-1)), r"Join\.learner: must be >= 0"),
        (_env(pull_done=pb.PullDone(learner=1, version=-4)), r"PullDone\.version: must be >= 0"),
        (
            _env(push_shards=pb.PushShards(transfers=[pb.Transfer(), pb.Transfer(layer=-3)])),
            r"PushShards\.transfers\[1\]\.layer: must be >= 0",
        ),
        (
            _env(push_requested=pb.PushRequested(t=1.0, learner=2)),
            r"PushRequested\.meta: missing",
        ),
        (
            _env(push_requested=pb.PushRequested(meta=pb.PushMeta(start_chunk=-7))),
            r"PushRequested\.meta\.start_chunk: must be >= 0",
        ),
        (_env(grant_chunk=pb.GrantChunk(learner=1, chunk=-1)), r"GrantChunk\.chunk: must be"),
        (
            _env(decide=pb.Decide(learners=[1, 2], accepted=[True])),
            r"Decide: per-learner tuples differ in length",
        ),
        # join (field 2) holding learner (field 2) as a length-delimited string
        (_tag(2, 2) + b"\x04" + _tag(2, 2) + b"\x02ab", r"Join\.learner: wrong wire type 2"),
        # join (field 2) sent as a varint instead of a message
        (_tag(2, 0) + b"\x05", r"Envelope\.join: wrong wire type 0"),
        # push_requested.meta (field 3) sent as a double
        (_tag(6, 2) + b"\x09" + _tag(3, 1) + bytes(8), r"PushRequested\.meta: wrong wire type"),
        # job_token as a varint
        (_tag(1, 0) + b"\x01" + _env(tick=pb.Tick()), r"Envelope\.job_token: wrong wire type"),
    ],
)
def test_decode_rejects_bad_bytes(data, match):
    with pytest.raises(ValueError, match=match):
        c.decode(data)


@pytest.mark.parametrize("data", ["text", None, 12, [1, 2]])
def test_decode_rejects_non_bytes(data):
    with pytest.raises(ValueError, match="expected bytes"):
        c.decode(data)


def test_from_proto_rejects_non_envelopes():
    with pytest.raises(ValueError, match=r"expected a syncer_pb2\.Envelope"):
        c.from_proto(pb.Join(learner=1))
    with pytest.raises(ValueError, match="holds no message"):
        c.from_proto(pb.Envelope())


# -------------------------------------------------------------------------- sizes


def big_push() -> m.PushRequested:
    meta = m.PushMeta(
        tokens=2**40,
        steps=10_000,
        base_version=2**31,
        incarnation=1000,
        train_seconds=1234.5678,
        pulled=False,
        start_chunk=2**40,
        start_offset=2**31,
        spans=tuple(m.Span(c, 2**20, 2**20 + 64) for c in range(2**40, 2**40 + 32)),
    )
    return m.PushRequested(1.7e9, learner=2**20, meta=meta)


def big_decide(n: int = 64) -> m.Decide:
    return m.Decide(
        round_id=2**40,
        learners=tuple(range(2**20, 2**20 + n)),
        accepted=tuple(i % 3 != 0 for i in range(n)),
        tokens=tuple(2**40 + i for i in range(n)),
        steps=tuple(10_000 + i for i in range(n)),
        weights=tuple(1.0 / (i + 1) for i in range(n)),
        sq_norms=tuple(math.pi * (i + 1) for i in range(n)),
    )


def test_message_sizes():
    token = "x" * 64  # a 256-bit credential, hex
    push = len(c.encode(big_push(), job_token=token))
    decide = len(c.encode(big_decide(64), job_token=token))
    assert push < 1024, push
    assert decide < 4096, decide
    assert same(c.decode(c.encode(big_decide(64))), big_decide(64))
    for x in EXAMPLES:  # typical messages are far below 1 KB
        assert len(c.encode(x, job_token=token)) < 1024


# ---------------------------------------------------------------- import, gencode


def test_codec_imports_without_jax():
    code = (
        "import sys\n"
        "import dipsjax.transport.control_codec as c\n"
        "from dipsjax.syncer import messages as m\n"
        "assert c.decode(c.encode(m.Tick(1.0))) == m.Tick(1.0)\n"
        "bad = sorted(k for k in sys.modules if k == 'jax' or k.startswith(('jax.', 'jaxlib')))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


# The stamps the generator writes: grpc_tools' own version, and the protobuf version its
# bundled protoc targets. A newer grpcio-tools within the pinned range writes newer ones
# and otherwise the same code, so the comparison below masks them; the committed stamps are
# checked against the pins instead (the runtime refuses code stamped newer than itself).
_GRPC_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", re.M)
_PROTOBUF_STAMP = re.compile(
    r"^# Protobuf Python Version: ([0-9.]+)$|"
    r"ValidateProtobufRuntimeVersion\(\n\s+_runtime_version\.Domain\.PUBLIC,\n"
    r"\s+(\d+),\n\s+(\d+),\n\s+(\d+),\n",
    re.M,
)


def _without_version_stamps(text):
    text = _GRPC_STAMP.sub("GRPC_GENERATED_VERSION = '*'", text)
    return _PROTOBUF_STAMP.sub("<protobuf version>", text)


def _lower_pin(package):
    pyproject = (ROOT / "pyproject.toml").read_text()
    found = re.search(rf'"{package}>=([0-9.]+),', pyproject)
    assert found, f"pyproject.toml pins no lower bound for {package}"
    return tuple(int(x) for x in found.group(1).split("."))


def test_version_stamps_are_masked_and_nothing_else():
    grpc_code = "import grpc\nGRPC_GENERATED_VERSION = '1.85.4'\nGRPC_VERSION = 1\n"
    assert _without_version_stamps(grpc_code) == _without_version_stamps(
        grpc_code.replace("1.85.4", "1.85.1")
    )
    assert _without_version_stamps(grpc_code) != _without_version_stamps(
        grpc_code.replace("GRPC_VERSION = 1", "GRPC_VERSION = 2")
    )
    committed = (ROOT / "dipsjax/transport/proto/syncer_pb2.py").read_text()
    newer = re.sub(r"Version: [0-9.]+", "Version: 9.1.2", committed)
    newer = newer.replace("PUBLIC,\n    7,\n", "PUBLIC,\n    9,\n")
    assert newer != committed
    assert _without_version_stamps(newer) == _without_version_stamps(committed)
    assert _without_version_stamps(committed).count("<protobuf version>") == 2


def test_committed_code_runs_on_the_oldest_pinned_runtimes():
    proto = ROOT / "dipsjax/transport/proto"
    grpc_stamp = _GRPC_STAMP.search((proto / "syncer_pb2_grpc.py").read_text()).group(1)
    assert tuple(int(x) for x in grpc_stamp.split(".")) <= _lower_pin("grpcio"), (
        f"syncer_pb2_grpc.py is stamped grpcio {grpc_stamp}, newer than the pinned minimum: "
        "regenerate with the oldest pinned grpcio-tools or raise the pin"
    )
    pb_version = re.search(
        r"^# Protobuf Python Version: ([0-9.]+)$", (proto / "syncer_pb2.py").read_text(), re.M
    )
    assert tuple(int(x) for x in pb_version.group(1).split(".")) <= _lower_pin("protobuf")


def test_generated_code_matches_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            "dipsjax/transport/proto/syncer.proto",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for name in ("syncer_pb2.py", "syncer_pb2.pyi", "syncer_pb2_grpc.py"):
        fresh = (tmp_path / "dipsjax/transport/proto" / name).read_text()
        committed = (ROOT / "dipsjax/transport/proto" / name).read_text()
        assert _without_version_stamps(fresh) == _without_version_stamps(committed), (
            f"{name} is stale: run scripts/gen_proto.sh"
        )


def test_grpc_service_is_generated():
    grpc_mod = pytest.importorskip("dipsjax.transport.proto.syncer_pb2_grpc")
    assert hasattr(grpc_mod, "SyncerStub") and hasattr(grpc_mod, "SyncerServicer")
    service = pb.DESCRIPTOR.services_by_name["Syncer"]
    call, watch = service.methods_by_name["Call"], service.methods_by_name["Watch"]
    assert (call.input_type.name, call.output_type.name) == ("Envelope", "Replies")
    assert (watch.input_type.name, watch.output_type.name) == ("WatchRequest", "Envelope")
    assert watch.server_streaming and not call.server_streaming
