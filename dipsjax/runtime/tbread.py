"""Reads back the TensorBoard scalars a run wrote (``RUN_DIR/tb/ROLE/events.out.tfevents.*``)
without TensorFlow or TensorBoard: the files are TFRecord frames of ``Event`` protobufs,
and tensorboardX ships the protobuf classes.

``scalars(RUN_DIR / "tb" / "leader")`` -> ``{tag: [(step, value), ...]}`` in file order;
``run_scalars(RUN_DIR)`` -> ``{role: scalars}`` for every role that wrote any.
"""

from __future__ import annotations

import struct
from pathlib import Path


def _records(path: Path):
    data = path.read_bytes()
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        start = at + 12  # length (8), its CRC (4)
        if start + length + 4 > len(data):
            break  # a frame still being written
        yield data[start : start + length]
        at = start + length + 4  # the payload's CRC (4)


def scalars(directory: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of ``directory``: ``{tag: [(step, value)]}``."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(directory).glob("events.out.tfevents.*")):
        for raw in _records(path):
            event = event_pb2.Event.FromString(raw)
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return out


def run_scalars(run_dir: str | Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{role: scalars}`` for every role folder under ``RUN_DIR/tb``."""
    root = Path(run_dir) / "tb"
    found = (
        {d.name: scalars(d) for d in sorted(root.iterdir()) if d.is_dir()} if root.exists() else {}
    )
    return {role: s for role, s in found.items() if s}
