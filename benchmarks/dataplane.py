"""Data plane: push + pull of a 100M-parameter BF16 model between a learner and 2 followers,
against a raw TCP transfer of the same bytes over the same topology, in the same run.

The followers run in a child process (two servers, as two followers would), the learner in
this one. Data plane: the learner encodes FP32 tensors to BF16, frames and checksums them,
and streams half to each follower concurrently (encoding overlapped with sending); the
followers check, decode to FP32 and stage them; then the learner pulls the model back the
same way (followers encode, learner decodes). Raw TCP: the same number of bytes, already
serialized, sent and received with ``sendall``/``recv_into`` and nothing else.

The data plane is measured twice, as runs use it (TLS with the job's certificates, mutual:
``dipsjax.runtime.credentials``) and in plain TCP (``RunSpec.tls=False``), so that what TLS
costs shows beside what the framing costs.

Run: ``.venv/bin/python benchmarks/dataplane.py`` (``--params 20e6`` for a quick run;
``--tiny``: 4M parameters, 1 trial, a harness check whose speed figures mean nothing).

Both forms also check that transfers stream (:func:`_streams`, figures
``dataplane_push_streams`` and ``dataplane_pull_streams``, 1 when they do): a push whose
sender encoded every tensor before sending any, or a pull whose follower encoded (or whose
learner received) the whole shard before the learner got its first tensor, scores 0. The
check waits on events, not on timings, so it holds on a loaded machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
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


def _raw_followers(nbytes: list[int], conn) -> None:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]

    def serve(sock: socket.socket, n: int) -> None:
        buf = bytearray(n)
        out = bytes(n)
        while True:
            try:
                c, _ = sock.accept()
            except OSError:
                return
            with c:
                while True:
                    view, got = memoryview(buf), 0
                    while got < n:
                        k = c.recv_into(view[got:], n - got)
                        if k == 0:
                            break
                        got += k
                    if got < n:
                        break
                    c.sendall(b"A")
                    if len(c.recv(1)) != 1:
                        break
                    c.sendall(out)

    for s, n in zip(socks, nbytes, strict=True):
        threading.Thread(target=serve, args=(s, n), daemon=True).start()
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


def _streams(n: int = 8, size: int = 1 << 18, seconds: float = 20.0) -> tuple[int, int]:
    """``(push streams, pull streams)``, each 1 or 0, through a follower in this process.

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
        pushed = [(i, x) for i, x in enumerate(xs[:-1])]
        pushed.append((n - 1, _Gated(xs[-1], first_read, late_push, seconds)))
        client.push(1, 0, 0, 0, pushed)
        got: dict = {}

        def sink(tid: int, x: np.ndarray) -> None:
            got[tid] = x
            first_sunk.set()

        client.pull(sink=sink)
    finally:
        client.close()
        server.close()
    assert sorted(staged) == sorted(got) == list(range(n)), (sorted(staged), sorted(got))
    return int(not late_push), int(not late_pull)


# ------------------------------------------------------------------ learner (parent)


def _timed_dataplane(addresses, model, tls=None) -> float:
    from dipsjax.transport import dataplane as dp

    clients = [dp.DataPlaneClient(a, ssl_context=tls) for a in addresses]
    pulled: dict[int, dict] = {}

    def push_pull(k: int) -> None:
        clients[k].push(1, 0, 0, 0, sorted(_shard(model, k).items()))
        pulled[k] = clients[k].pull()[1]

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
    return dt


def _timed_raw(addresses, nbytes) -> float:
    def push_pull(k: int) -> None:
        with socket.create_connection(addresses[k]) as s:
            s.sendall(payloads[k])
            assert s.recv(1) == b"A"
            s.sendall(b"P")
            buf = bytearray(nbytes[k])
            view, got = memoryview(buf), 0
            while got < nbytes[k]:
                got += s.recv_into(view[got:], nbytes[k] - got)

    payloads = [bytes(n) for n in nbytes]
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
    model = _model(args.params)
    n_params = sum(x.size for x in model.values())
    nbytes = [2 * sum(x.size for x in _shard(model, k).values()) for k in range(2)]
    wire = 2 * sum(nbytes)  # pushed and pulled, BF16

    from dipsjax.runtime import credentials

    creds = credentials.create(Path(tempfile.mkdtemp(prefix="dipsjax-dp-")) / "credentials")
    tls = creds.ssl_client()
    dp_proc, dp_conn, addrs = _start(_dataplane_followers, args.params, creds.directory)
    dp_addr, tls_addr = addrs[:2], addrs[2:]
    raw_proc, raw_conn, raw_addr = _start(_raw_followers, nbytes)
    _timed_dataplane(dp_addr, model)  # warm-up: compiles the codecs on both ends
    _timed_dataplane(tls_addr, model, tls)
    _timed_raw(raw_addr, nbytes)
    dps, tlss, raws = [], [], []
    for _ in range(args.trials):  # interleaved, so that machine noise hits all three
        raws.append(_timed_raw(raw_addr, nbytes))
        dps.append(_timed_dataplane(dp_addr, model))
        tlss.append(_timed_dataplane(tls_addr, model, tls))
    for conn, proc in ((dp_conn, dp_proc), (raw_conn, raw_proc)):
        conn.send("done")
        proc.join(5)
    push_streams, pull_streams = _streams()
    t_dp, t_raw, t_tls = (statistics.median(x) for x in (dps, raws, tlss))
    print(f"model: {n_params / 1e6:.0f}M params, {wire / 1e6:.0f} MB on the wire (push + pull)")
    print(f"raw TCP:          {t_raw:.3f} s  ({wire / t_raw / 1e9:.2f} GB/s)  trials {raws}")
    print(f"data plane:       {t_dp:.3f} s  ({wire / t_dp / 1e9:.2f} GB/s)  trials {dps}")
    print(f"data plane + TLS: {t_tls:.3f} s  ({wire / t_tls / 1e9:.2f} GB/s)  trials {tlss}")
    print(f"dataplane_push_pull_ratio: {t_raw / t_dp:.2f} (goal: >= 0.70)")
    print(f"dataplane_tls_ratio: {t_dp / t_tls:.2f} (goal: >= 0.70, TLS against plain framing)")
    print(f"dataplane_push_streams: {push_streams} (goal: 1, sent while encoded)")
    print(f"dataplane_pull_streams: {pull_streams} (goal: 1, handed over while sent)")


if __name__ == "__main__":
    main()
