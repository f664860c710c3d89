"""Data plane: push + pull of a 100M-parameter model between a learner and 2 followers,
against a raw TCP transfer of the same bytes over the same topology, in the same run.

The followers run in a child process (two servers, as two followers would), the learner in
this one. The learner streams half of its push to each follower concurrently, the followers
check and stage it, then the learner pulls the model back the same way. Two forms:

- ``runtime`` (the headline figures): what ``dipsjax run`` sends. The learner's
  pseudo-gradient leaves its device in BF16 (``runtime.partition.Compute`` casts it there,
  where an accelerator does it for free and the device-to-host copy halves), so the push is
  framed and checksummed without converting anything; the learner pulls FP32
  (``runtime.learner.LearnerNode.pull``).
- ``host``: BF16 both ways with both conversions on the host's CPU (FP32 encoded to BF16
  for the push, the follower encodes its FP32 shard for the pull, the learner widens it):
  the form this benchmark measured until 2026-12-06, reported.

Raw TCP: the same number of bytes each way, already serialized in written memory
(:func:`_filled`), sent and received with ``sendall``/``recv_into`` and nothing else (each
follower receives into a buffer of its own, allocated once; the learner into fresh
uninitialised memory, as the data plane's). The same over bare TLS sockets with the job's
certificates (``dataplane_bare_tls_ratio``): what TLS alone costs here, the ceiling for
``dataplane_tls_ratio``.

The data plane is measured twice, as runs use it (TLS with the job's certificates, mutual:
``dipsjax.runtime.credentials``) and in plain TCP (``RunSpec.tls=False``), so that what TLS
costs shows beside what the framing costs.

Run: ``.venv/bin/python benchmarks/dataplane.py`` (``--params 20e6`` for a quick run;
``--tiny``: 4M parameters, 1 trial, a harness check whose speed figures mean nothing).

The benchmark also checks that transfers stream (:func:`_streams`, figures
``dataplane_push_streams`` and ``dataplane_pull_streams``, 1 when they do): a push whose
sender encoded every tensor before sending any, or a pull whose follower encoded (or whose
learner received) the whole shard before the learner got its first tensor, scores 0. The
check waits on events, not on timings, so it holds on a loaded machine. Both forms are
checked; a figure is 1 only when both stream.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TENSOR = 2_000_000  # values per tensor (8 MB in FP32, 4 MB in BF16)


def _model(params: float) -> dict[int, np.ndarray]:
    n = max(2, round(params / TENSOR))
    rng = np.random.default_rng(0)
    return {i: rng.standard_normal(TENSOR).astype(np.float32) for i in range(n)}


def _shard(model: dict, k: int) -> dict:
    return {i: x for i, x in model.items() if i % 2 == k}


# ---------------------------------------------------------------- followers (child)


_FILLED: dict[int, np.ndarray] = {}
_FILLING = threading.Lock()  # (the raw followers' threads share what they send)


def _filled(n: int) -> np.ndarray:
    """``n`` bytes of data in memory that is written (made once per size): what raw TCP
    sends. Not ``bytes(n)``: that is calloc'ed memory never written, whose pages all map the
    kernel's one zero page, so sending it copies from one cache-resident page (measured
    here: 200 MB sent in 0.051 s against 0.065 s for written memory)."""
    with _FILLING:
        if n not in _FILLED:
            _FILLED[n] = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
        return _FILLED[n]


def _dataplane_followers(params: float, creds: str, conn) -> None:
    from dipsjax.runtime import credentials
    from dipsjax.transport import dataplane as dp

    model = _model(params)
    servers = []
    for tls in (None, credentials.load(creds).ssl_server()):  # two plain, two TLS
        for k in range(2):
            shard = _shard(model, k)
            staged = {}

            def on_push(r, j, inc, base, tensors, staged=staged):
                staged[r] = tensors

            servers.append(
                dp.DataPlaneServer(
                    on_push, lambda v, shard=shard: (0, shard), port=0, ssl_context=tls
                )
            )
    conn.send([s.address for s in servers])
    conn.recv()  # until the parent is done


def _raw_followers(creds: str, conn) -> None:
    """Two plain and two TLS servers (the job's certificates, as the data plane's) of bare
    sockets: the bytes and nothing else."""
    from dipsjax.runtime import credentials

    tls = credentials.load(creds).ssl_server()
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(4)]

    def serve(sock: socket.socket, tls_context) -> None:
        # This follower's own buffers, by transfer size, allocated once (as before the
        # sizes varied): the push is received into memory already mapped.
        buffers: dict[tuple[int, int], tuple[bytearray, np.ndarray]] = {}
        while True:
            try:
                c, _ = sock.accept()
            except OSError:
                return
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the data plane's
            if tls_context is not None:
                try:
                    c = tls_context.wrap_socket(c, server_side=True)
                except OSError:
                    c.close()
                    continue
            with c:
                # The transfer's sizes first (16 bytes: in, out), then the same bytes as the
                # data plane's: a push in, an acknowledgement, a pull request, a pull out.
                head = b""
                while len(head) < 16:  # (an SSL socket takes no MSG_WAITALL)
                    more = c.recv(16 - len(head))
                    if not more:
                        break
                    head += more
                if len(head) < 16:
                    continue
                n_in, n_out = struct.unpack("<QQ", head)
                if (n_in, n_out) not in buffers:
                    buffers[n_in, n_out] = bytearray(n_in), _filled(n_out)
                buf, out = buffers[n_in, n_out]
                view, got = memoryview(buf), 0
                while got < n_in:
                    k = c.recv_into(view[got:], n_in - got)
                    if k == 0:
                        break
                    got += k
                if got < n_in:
                    continue
                c.sendall(b"A")
                if len(c.recv(1)) != 1:
                    continue
                c.sendall(out)

    for i, s in enumerate(socks):
        threading.Thread(target=serve, args=(s, tls if i >= 2 else None), daemon=True).start()
    conn.send([s.getsockname()[:2] for s in socks])
    conn.recv()


# ------------------------------------------------------------------ streaming check


class _Gated:
    """A tensor whose host value (``np.asarray``, which the data plane's encoder calls)
    is given only once ``gate`` is set (``False`` recorded in ``late`` if it is not within
    ``seconds``): what a transfer that streams sets before it needs this tensor."""

    def __init__(self, x: np.ndarray, gate: threading.Event, late: list, seconds: float):
        self.x, self.gate, self.late, self.seconds = x, gate, late, seconds

    def __array__(self, dtype=None, copy=None):
        if not self.gate.wait(self.seconds):
            self.late.append(False)
        return self.x if dtype is None else self.x.astype(dtype)


def _streams(form: str, n: int = 8, size: int = 1 << 18, seconds: float = 20.0) -> tuple[int, int]:
    """``(push streams, pull streams)``, each 1 or 0, through a follower in this process,
    for ``form`` (``"runtime"``: BF16 tensors pushed as they are, an FP32 pull; ``"host"``:
    FP32 tensors encoded on the host, a BF16 pull).

    Push: the learner's last tensor is encoded only once the follower has read the first
    frame's header (``DataPlaneServer(expect=...)``, called as each frame's header is read,
    before its body). Pull: the follower's last tensor is encoded only once the learner's
    ``sink`` has the first tensor. A sender that serialized the whole transfer first, or a
    learner that received the whole pull before handing any of it over, waits ``seconds``
    and scores 0 (the transfer then completes, and must still carry every tensor)."""
    from dipsjax.transport import dataplane as dp

    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    first_read, first_sunk = threading.Event(), threading.Event()
    late_push: list = []
    late_pull: list = []
    staged: dict = {}

    def expect(header) -> None:
        if header.tensor == 0:
            first_read.set()

    served = {i: x for i, x in enumerate(xs[:-1])}
    served[n - 1] = _Gated(xs[-1], first_sunk, late_pull, seconds)
    server = dp.DataPlaneServer(
        lambda r, j, inc, base, tensors: staged.update(tensors),
        lambda v: (0, served),
        port=0,
        expect=expect,
    )
    client = dp.DataPlaneClient(server.address)
    try:
        import ml_dtypes

        ys = [x.astype(ml_dtypes.bfloat16) for x in xs] if form == "runtime" else xs
        pushed = [(i, y) for i, y in enumerate(ys[:-1])]
        pushed.append((n - 1, _Gated(ys[-1], first_read, late_push, seconds)))
        client.push(1, 0, 0, 0, pushed)
        got: dict = {}

        def sink(tid: int, x: np.ndarray) -> None:
            got[tid] = x
            first_sunk.set()

        client.pull(codec="fp32" if form == "runtime" else "bf16", sink=sink)
    finally:
        client.close()
        server.close()
    assert sorted(staged) == sorted(got) == list(range(n)), (sorted(staged), sorted(got))
    return int(not late_push), int(not late_pull)


# ------------------------------------------------------------------ learner (parent)


def _timed_dataplane(addresses, model, form: str, tls=None) -> float:
    """One push + pull through the data plane: ``form`` ``"runtime"`` as the runtime's
    learner makes them (its pseudo-gradient leaves the device in BF16, :class:`~dipsjax.
    runtime.partition.Compute`; it pulls FP32), ``"host"`` with both conversions on the
    host (FP32 encoded to BF16 for the push; a BF16 pull widened to FP32)."""
    from dipsjax.transport import dataplane as dp

    clients = [dp.DataPlaneClient(a, ssl_context=tls) for a in addresses]
    pulled: dict[int, dict] = {}
    pull_codec = "fp32" if form == "runtime" else "bf16"

    def push_pull(k: int) -> None:
        clients[k].push(1, 0, 0, 0, sorted(_shard(model, k).items()))
        pulled[k] = clients[k].pull(codec=pull_codec)[1]

    t = time.perf_counter()
    threads = [threading.Thread(target=push_pull, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dt = time.perf_counter() - t
    for c in clients:
        c.close()
    assert sum(len(p) for p in pulled.values()) == len(model)
    assert {x.dtype for p in pulled.values() for x in p.values()} == {np.dtype(np.float32)}
    return dt


def _timed_raw(addresses, sizes, tls=None) -> float:
    """The same bytes over bare sockets (``tls``: bare TLS sockets): ``sizes[k]`` is
    follower ``k``'s (push, pull)."""

    def push_pull(k: int) -> None:
        n_in, n_out = sizes[k]
        s = socket.create_connection(addresses[k])
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the data plane's
        if tls is not None:
            s = tls.wrap_socket(s, server_hostname=addresses[k][0])
        with s:
            s.sendall(struct.pack("<QQ", n_in, n_out))
            s.sendall(payloads[k])
            assert s.recv(1) == b"A"
            s.sendall(b"P")
            buf = np.empty(n_out, np.uint8)  # not zero-filled, as the data plane's
            view, got = memoryview(buf), 0
            while got < n_out:
                got += s.recv_into(view[got:], n_out - got)

    payloads = [_filled(n_in) for n_in, _ in sizes]
    t = time.perf_counter()
    threads = [threading.Thread(target=push_pull, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def _start(target, *args):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    return proc, parent, parent.recv()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="4M parameters, 1 trial")
    args = parser.parse_args()
    if args.tiny:
        args.params, args.trials = 4e6, 1
    import ml_dtypes

    model = _model(args.params)
    n_params = sum(x.size for x in model.values())
    # What the runtime's learner pushes: its pseudo-gradient, cast to BF16 on its device.
    model_bf16 = {i: x.astype(ml_dtypes.bfloat16) for i, x in model.items()}
    values = [sum(x.size for x in _shard(model, k).values()) for k in range(2)]
    sizes = {"runtime": [(2 * n, 4 * n) for n in values], "host": [(2 * n, 2 * n) for n in values]}
    pushed = {"runtime": model_bf16, "host": model}

    from dipsjax.runtime import credentials

    creds = credentials.create(Path(tempfile.mkdtemp(prefix="dipsjax-dp-")) / "credentials")
    tls = creds.ssl_client()
    dp_proc, dp_conn, addrs = _start(_dataplane_followers, args.params, creds.directory)
    dp_addr, tls_addr = addrs[:2], addrs[2:]
    raw_proc, raw_conn, raws = _start(_raw_followers, creds.directory)
    raw_addr, raw_tls_addr = raws[:2], raws[2:]
    for form in ("runtime", "host"):  # warm-up: compiles the codecs on both ends
        _timed_dataplane(dp_addr, pushed[form], form)
        _timed_dataplane(tls_addr, pushed[form], form, tls)
        _timed_raw(raw_addr, sizes[form])
    _timed_raw(raw_tls_addr, sizes["runtime"], tls)
    times: dict[str, list[float]] = {}
    for _ in range(args.trials):  # interleaved, so that machine noise hits all of them
        for form in ("runtime", "host"):
            times.setdefault(f"raw {form}", []).append(_timed_raw(raw_addr, sizes[form]))
            if form == "runtime":
                times.setdefault("raw tls", []).append(_timed_raw(raw_tls_addr, sizes[form], tls))
            times.setdefault(form, []).append(_timed_dataplane(dp_addr, pushed[form], form))
            times.setdefault(f"tls {form}", []).append(
                _timed_dataplane(tls_addr, pushed[form], form, tls)
            )
    for conn, proc in ((dp_conn, dp_proc), (raw_conn, raw_proc)):
        conn.send("done")
        proc.join(5)
    streams = [_streams(form) for form in ("runtime", "host")]
    push_streams, pull_streams = (min(x) for x in zip(*streams, strict=True))
    t = {name: statistics.median(x) for name, x in times.items()}
    print(f"model: {n_params / 1e6:.0f}M params")
    for form, what in (
        ("runtime", "the runtime's: BF16 push cast on the device, FP32 pull"),
        ("host", "BF16 both ways, converted on the host"),
    ):
        wire = sum(a + b for a, b in sizes[form])
        print(f"{form}: {what}, {wire / 1e6:.0f} MB on the wire")
        rows = [(f"raw {form}", "raw TCP")]
        if form == "runtime":
            rows.append(("raw tls", "bare TLS sockets"))
        rows += [(form, "data plane"), (f"tls {form}", "data plane + TLS")]
        for name, label in rows:
            trials = ", ".join(f"{x:.3f}" for x in times[name])
            print(
                f"  {label:17s} {t[name]:.3f} s  ({wire / t[name] / 1e9:.2f} GB/s)  trials {trials}"
            )
    print(
        f"dataplane_host_bf16_ratio: {t['raw host'] / t['host']:.2f} "
        "(both conversions on the host's CPU; goal: none, reported)"
    )
    print(f"dataplane_host_bf16_tls_ratio: {t['host'] / t['tls host']:.2f} (goal: none, reported)")
    print(
        f"dataplane_bare_tls_ratio: {t['raw runtime'] / t['raw tls']:.2f} "
        "(bare TLS sockets against bare TCP, the same bytes; goal: none, what TLS alone costs)"
    )
    print(f"dataplane_push_pull_ratio: {t['raw runtime'] / t['runtime']:.2f} (goal: >= 0.70)")
    print(
        f"dataplane_tls_ratio: {t['runtime'] / t['tls runtime']:.2f} "
        "(goal: >= 0.70, TLS against plain framing)"
    )
    print(f"dataplane_push_streams: {push_streams} (goal: 1, sent while encoded)")
    print(f"dataplane_pull_streams: {pull_streams} (goal: 1, handed over while sent)")


if __name__ == "__main__":
    main()
