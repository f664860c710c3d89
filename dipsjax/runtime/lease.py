"""The leader's lease and epochs (fencing tokens), kept in the run folder.

Every leader process that starts deciding claims the next **epoch**: it creates
``RUN_DIR/lease/epoch-NNNNNNNN`` exclusively (``O_CREAT | O_EXCL``: of two processes that try
the same number at once, one gets it), so epochs go up by one with each leader, restarted
or taken over, and two processes never share one. The epoch travels on every control
message (``Envelope.epoch`` of each action, ``Replies.epoch`` of each answer); learners
and followers refuse and count what comes from an epoch older than one they have heard
(:class:`dipsjax.runtime.client.Delivery`), and a leader that finds a newer epoch claimed
is **deposed**: it decides nothing more (:meth:`Lease.deposed`).

With a standby leader (``RunSpec.standby``) the active leader also renews a **lease**,
``RUN_DIR/lease/lease.json``, every :attr:`Lease.renew_every` seconds: its epoch, address,
process and a count of renewals. The standby (:class:`Follow`) watches that count with its
own monotonic clock (no clock is shared between hosts): unchanged for ``RunSpec.leader_lease``
seconds, the lease has lapsed and the standby claims the next epoch, then takes over
(:func:`takeover`). A lease that says the job stopped ends the standby.

The folder must be shared by both leaders' hosts (the run folder is: snapshots and tape
live there too). Nothing here imports JAX or gRPC.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

EPOCH_PREFIX = "epoch-"


def lease_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "lease"


def newest_epoch(run_dir: str | Path) -> int:
    """The newest epoch claimed in the run (0: none yet)."""
    d = lease_dir(run_dir)
    if not d.is_dir():
        return 0
    epochs = [
        int(p.name[len(EPOCH_PREFIX) :])
        for p in d.iterdir()
        if p.name.startswith(EPOCH_PREFIX) and p.name[len(EPOCH_PREFIX) :].isdigit()
    ]
    return max(epochs, default=0)


def epoch_path(run_dir: str | Path, epoch: int) -> Path:
    return lease_dir(run_dir) / f"{EPOCH_PREFIX}{epoch:08d}"


def claim(run_dir: str | Path, epoch: int, holder: str) -> bool:
    """Claims ``epoch`` for ``holder`` (True), unless another process has (False)."""
    path = epoch_path(run_dir, epoch)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"holder": holder, "claimed": time.time()}))
    return True


def claim_next(run_dir: str | Path, holder: str) -> int:
    """Claims the epoch after the newest (tried again if another process takes it first)."""
    while True:
        epoch = newest_epoch(run_dir) + 1
        if claim(run_dir, epoch, holder):
            return epoch


def holder_name(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


def read_lease(run_dir: str | Path) -> dict[str, Any] | None:
    """The lease as its holder last wrote it (None: none written, or being replaced)."""
    try:
        return json.loads((lease_dir(run_dir) / "lease.json").read_text())
    except (OSError, ValueError):
        return None


class Lease:
    """The active leader's side: its epoch, renewals, and whether it has been deposed."""

    def __init__(self, run_dir: str | Path, epoch: int, holder: str, address: str) -> None:
        self.run_dir, self.epoch, self.holder, self.address = Path(run_dir), epoch, holder, address
        self.renewals = 0
        self.renewed_at = -float("inf")  # monotonic
        self._lock = threading.Lock()
        self._deposed = False

    def deposed(self) -> bool:
        """Whether a newer epoch has been claimed (once so, always so): a listing of the
        lease folder (not a ``stat`` of one name, which a network filesystem may answer
        from its cache of names that were not there), cheap enough before every action."""
        if not self._deposed:
            self._deposed = newest_epoch(self.run_dir) > self.epoch
        return self._deposed

    def fresh(self, lease_s: float) -> bool:
        """Whether this leader renewed its lease less than half a lease ago by its own
        clock: one that did not (paused, or its disk slow) renews before it decides, and
        finds out then whether it was deposed meanwhile."""
        return time.monotonic() - self.renewed_at < lease_s / 2

    def renew(self, stopped: bool = False) -> bool:
        """Writes the lease anew (False, writing nothing: deposed). ``stopped``: the job
        has stopped, and a standby that reads it ends instead of taking over."""
        with self._lock:  # (the takeover's renewal thread, then the event loop)
            if self.deposed():
                return False
            self.renewals += 1
            doc = {
                "epoch": self.epoch,
                "holder": self.holder,
                "address": self.address,
                "renewals": self.renewals,
                "t": time.time(),
                "stopped": stopped,
            }
            # Through a temporary file of this process's own: another leader process
            # renewing at the same moment never takes it away.
            path = lease_dir(self.run_dir) / "lease.json"
            tmp = path.with_name(f"lease.json.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)
            self.renewed_at = time.monotonic()
            return True

    def keep_renewing(self, every: float) -> Any:
        """Renews from a thread every ``every`` seconds until the returned callable is
        called (it returns once the thread has ended): a standby that took over, while it
        restores, so that another standby does not see the new epoch's lease lapse."""
        done = threading.Event()

        def loop() -> None:
            while not done.wait(every) and self.renew():
                pass

        thread = threading.Thread(target=loop, daemon=True, name="lease-renewal")
        thread.start()

        def stop() -> None:
            done.set()
            thread.join()

        return stop


@dataclasses.dataclass
class Follow:
    """The standby's view of the lease: it lapses once neither its epoch nor its renewal
    count has changed for ``lease_s`` seconds of this process's monotonic clock, or at once
    if no leader ever claimed one (``newest_epoch`` 0) for that long."""

    run_dir: Path
    lease_s: float
    seen: tuple[int, int] | None = None  # (epoch, renewals)
    since: float = dataclasses.field(default_factory=time.monotonic)

    def poll(self, now: float | None = None) -> str:
        """``"stopped"`` (the job stopped: the standby ends), ``"lapsed"`` or ``"held"``."""
        now = time.monotonic() if now is None else now
        doc = read_lease(self.run_dir)
        newest = newest_epoch(self.run_dir)
        if doc is not None and doc.get("stopped") and doc.get("epoch") == newest:
            return "stopped"
        key = (newest, doc["renewals"] if doc and doc.get("epoch") == newest else -1)
        if key != self.seen:
            self.seen, self.since = key, now
            return "held"
        return "lapsed" if now - self.since > self.lease_s else "held"

    def age(self, now: float | None = None) -> float:
        """Seconds since the lease last changed, by this process's clock."""
        return (time.monotonic() if now is None else now) - self.since


class TapeFollower:
    """The standby's copy of the tape, read as the active leader writes it (whole lines,
    each parsed once), so that a takeover reads only what was written since its last
    :meth:`poll`. A tape whose file was replaced (a cut-back, another takeover's copy) is
    read again from its start."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.ino: int | None = None
        self.offset = 0
        self.records: list[dict[str, Any]] = []
        self.ends: list[int] = []  # each record's end, in bytes

    def poll(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            ino = st.st_ino
            if ino != self.ino or st.st_size < self.offset:  # replaced, or cut
                self.ino, self.offset, self.records, self.ends = ino, 0, [], []
            fh.seek(self.offset)
            try:
                self._take(fh.read())
            except ValueError:  # not a tape this can follow: the takeover reads it whole
                self.ino, self.offset, self.records, self.ends = None, 0, [], []

    def _take(self, data: bytes) -> None:
        end = data.rfind(b"\n")
        if end < 0:
            return
        at = self.offset
        for line in data[:end].split(b"\n"):
            self.records.append(json.loads(line))
            at += len(line) + 1
            self.ends.append(at)
        self.offset += end + 1

    def caught_up(self, path: str | Path, ino: int | None) -> list[dict[str, Any]] | None:
        """The records of ``path``, a copy of the tape file ``ino`` (the one the takeover
        copied): what was followed, plus what the copy holds past it; None if the file
        followed was another (the caller reads the copy whole)."""
        if ino is None or ino != self.ino:
            return None
        with open(path, "rb") as fh:
            fh.seek(self.offset)
            try:
                self._take(fh.read())
            except ValueError:
                return None
        return list(self.records)


def takeover(run_dir: str | Path, epoch: int) -> tuple[Path | None, int | None]:
    """Makes the run folder the new leader's (epoch ``epoch``, claimed): the deposed
    leader's folder ``RUN_DIR/leader`` moves to ``RUN_DIR/leader.epoch-E`` (E: its epoch),
    and a fresh ``RUN_DIR/leader`` gets copies of its snapshot and status (new files); the
    tape is copied to a new file in its place. The old leader writes its folder through a
    descriptor it opened at its start, and its tape through another: whatever it writes
    after this lands in the moved folder and the old tape's file, never in the new
    leader's. Returns the moved folder (None: there was no leader folder) and the inode of
    the tape file copied (None: no tape), for :meth:`TapeFollower.caught_up`."""
    run_dir = Path(run_dir)
    live = run_dir / "leader"
    if not live.is_dir():
        return None, None
    moved = run_dir / f"leader.{EPOCH_PREFIX}{epoch - 1:08d}"
    if moved.exists():  # a takeover that died half-way: keep what it moved
        moved = run_dir / f"leader.{EPOCH_PREFIX}{epoch - 1:08d}.{os.getpid()}"
    os.rename(live, moved)
    live.mkdir()
    for name in ("snapshot.json", "status.json"):
        if (moved / name).exists():
            shutil.copyfile(moved / name, live / name)
    tape = run_dir / "tape.jsonl"
    ino = None
    if tape.exists():
        try:
            want = json.loads((moved / "snapshot.json").read_text()).get("tape_records")
        except (OSError, ValueError):
            want = None
        tmp = run_dir / "tape.jsonl.takeover"
        for attempt in range(_TAPE_TRIES):
            with open(tape, "rb") as src, open(tmp, "wb") as dst:
                ino = os.fstat(src.fileno()).st_ino
                data = src.read()
                dst.write(data)
            have = data.count(b"\n")
            if want is None or have >= want:
                break
            if attempt == _TAPE_TRIES - 1:  # left as it is: the records may yet arrive
                tmp.unlink()
                raise ValueError(
                    f"{tape} holds {have} records, fewer than the {want} the snapshot in "
                    f"{moved} follows (not yet on this host's disk?): not taken over"
                )
            time.sleep(0.5)
        os.replace(tmp, tape)
    return moved, ino


_TAPE_TRIES = 6  # a short tape (a network filesystem behind): read again, 0.5 s apart


def snapshot_dir(run_dir: str | Path) -> Path:
    """Where the newest leader snapshot is: ``RUN_DIR/leader``, or, if a takeover died
    between moving the old folder and filling the new one, the newest moved folder."""
    run_dir = Path(run_dir)
    live = run_dir / "leader"
    if (live / "snapshot.json").exists():
        return live
    moved = sorted(
        (p for p in run_dir.glob(f"leader.{EPOCH_PREFIX}*") if (p / "snapshot.json").exists()),
        key=lambda p: p.name,
    )
    return moved[-1] if moved else live
