"""Training from ArrayRecord files through grain: learner throughput and flat memory.

Run: ``python benchmarks/data_pipeline.py`` (2-3 minutes on 2 shared CPU cores;
``--tiny``, a harness check whose figures mean nothing: 2 steps a trial, 1 trial, 8 chunks).

The corpus is the shipped Austen train split, byte-tokenized and cut into chunks of 4096
tokens (868 chunks), written as ArrayRecord files (:func:`dipsjax.data.records.write_chunks`)
in a temporary folder; they are read back by :class:`~dipsjax.data.records.RecordChunks`
(grain, one chunk at a time). The files were just written, so reads come from the page
cache, not a cold disk.

(a) Throughput. The tiny LLaMA (``get_config("tiny")``, one unsharded
:class:`~dipsjax.learner.Learner`) runs rounds of ``H`` steps on batches of 8 x 128 tokens,
the corpus's chunks read in order as pieces, three ways:

- ``grain``: as the runtime learner reads them: a :class:`~dipsjax.data.BatchStream` over
  ``RecordChunks`` (each piece through its grain dataset iterator, whose state is the data
  position) takes the round's batches (``take_round``), then the round runs;
- ``grain+prefetch``: the same stream with ``prefetch=2`` (grain reads ahead within the
  piece in a background thread), read lazily inside the round (the step on batch ``k``
  runs while batch ``k + 1`` is read);
- ``memory``: the same batches indexed from the in-memory array
  (:class:`~dipsjax.data.pipeline.TokenChunks`), read lazily inside the round.

Each trial runs all three on the same batches, back to back in a rotating order, after
warm-up. ``data_grain_memory_ratio`` is the median over trials of the per-trial ratio of
tokens/s (grain / memory), ``data_grain_prefetch_memory_ratio`` the same for the prefetching
stream. On a shared machine the per-trial wall-clock rates swing with the neighbours' load
(paired ratios from 0.3 to 2.5 under a load of 9-12 on 2 cores, where the median of 61
stayed within 0.01 of 1), so three views more are printed beside them: the ratio of the
best trials, the ratio of tokens per CPU second of the process, and the cost of reading a
batch alone each way (the same batches, after each trial) set against the step time.

(b) Memory. For a corpus of 1x, 4x and 16x the chunks (the chunks repeated), a fresh
process opens ``RecordChunks`` and reads every batch of it through a ``BatchStream``
(grain's iterator per chunk, ``prefetch=2``); it reports its resident memory (``VmRSS``
from ``/proc/self/status``, psutil where there is no ``/proc``) after the imports, and at
the end with its peak (``VmHWM``). ``data_rss_ratio_16x`` is peak(16x) / peak(1x).
grain imports JAX (and orbax): about 210 MiB before any data, as in a learner, which
imports JAX anyway; the growth over that is printed too.
For contrast (not in ``--tiny``), the same processes holding the chunks in memory
(``TokenChunks``) show how resident memory grows with the corpus when it is all loaded.

Ends with one line per figure, the headline ones with their goal, e.g.
``data_grain_memory_ratio: 0.99 (goal: >= 0.97)``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

RATIO_GOAL = 0.97
PREFETCH = 2
"""Batches grain reads ahead within a piece in the prefetching arm and the memory runs."""
RSS_GOAL = 1.1
SIZES = (1, 4, 16)


def memory_kib() -> dict[str, int]:
    """This process's resident memory now (``rss``) and at its peak (``peak``), in KiB."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
        )
        return {
            "rss": int(fields["VmRSS"].split()[0]),
            "peak": int(fields["VmHWM"].split()[0]),
        }
    except (OSError, KeyError, ValueError):
        import psutil

        info = psutil.Process().memory_info()
        peak = getattr(info, "peak_wset", info.rss)  # Windows keeps a peak; others: now
        return {"rss": info.rss // 1024, "peak": peak // 1024}


def child(mode: str, path: str, batch_size: int, seq_len: int) -> None:
    """A fresh process: read every batch of the corpus at ``path`` through a BatchStream
    (``grain``: over RecordChunks; ``memory``: all chunks loaded, then TokenChunks), print
    its memory."""
    from dipsjax.data.pipeline import BatchStream, TokenChunks
    from dipsjax.data.records import RecordChunks

    base = memory_kib()
    src = RecordChunks(path, batch_size, seq_len)
    if mode == "memory":
        chunks = np.empty((src.num_chunks, src.chunk_len + 1), np.int32)
        for c in range(src.num_chunks):
            chunks[c] = src.chunks[c]
        src = TokenChunks(chunks, batch_size, seq_len)
    checksum = 0
    t0 = time.perf_counter()
    stream = BatchStream(src, source=range(src.num_chunks), prefetch=PREFETCH)
    for b in stream:
        checksum += int(b.tokens[:, -1].sum())
    dt = time.perf_counter() - t0
    end = memory_kib()
    batches = stream.position.batches
    assert batches == src.num_chunks * src.batches_per_chunk
    print(json.dumps(dict(base=base, end=end, batches=batches, checksum=checksum, seconds=dt)))


def run_child(mode: str, path: Path, batch_size: int, seq_len: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(path), str(batch_size), str(seq_len)],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


ARMS = ("grain", "grain+prefetch", "memory")


def throughput(
    chunks: np.ndarray,
    folder: Path,
    *,
    batch_size: int,
    seq_len: int,
    steps: int,
    trials: int,
    warmup: int,
) -> dict[str, dict[str, list[float]]]:
    """Per trial, for rounds fed each way of :data:`ARMS`: tokens per second of wall-clock
    time (``wall``) and of this process's CPU time (``cpu``, all its threads), and the
    seconds one batch takes to read alone (``read``)."""
    from dipsjax.data.pipeline import BatchStream, TokenChunks
    from dipsjax.data.records import RecordChunks, write_chunks
    from dipsjax.learner import Learner
    from dipsjax.model import get_config

    path = write_chunks(folder / "austen.array_record", chunks)
    records = RecordChunks(path, batch_size, seq_len)
    memory = TokenChunks(chunks, batch_size, seq_len)
    per_chunk = memory.batches_per_chunk
    total = chunks.shape[0] * per_chunk

    def stream(prefetch: int) -> BatchStream:
        # Whole chunks in order from chunk 0, as a ledger would lease them (a cycle each).
        order = itertools.cycle(range(chunks.shape[0]))
        return BatchStream(records, source=lambda: next(order), prefetch=prefetch)

    streams = {"grain": stream(0), "grain+prefetch": stream(PREFETCH), "read": stream(0)}

    def feed(name: str, keys: list[tuple[int, int]]) -> Any:
        if name == "memory":
            return (memory.batch(c, i) for c, i in keys)
        st = streams[name]
        if name == "grain":  # as the runtime learner: the round's batches, then the round
            data = st.take_round(len(keys))
            got = [(c, i) for c, s, e in data.spans for i in range(s, e)]
            assert got == keys, (got[:3], keys[:3])
            return iter(data.batches)
        return (b.tokens for b in itertools.islice(st, len(keys)))  # read inside the round

    learner = Learner(get_config("tiny"), mesh=None, learner_id=0)
    tokens = steps * batch_size * seq_len
    out: dict[str, dict[str, list[float]]] = {
        name: {"wall": [], "cpu": [], "read": []} for name in ARMS
    }
    for trial in range(warmup + trials):
        first = (trial * steps) % total
        keys = [divmod((first + k) % total, per_chunk) for k in range(steps)]
        # Rotating orders: each arm runs first, second and third equally often (a drift
        # of the load cancels).
        order_ = list(ARMS[trial % 3 :] + ARMS[: trial % 3])
        if trial % 2:
            order_.reverse()
        for name in order_:
            t0, c0 = time.perf_counter(), time.process_time()
            learner.run_round(feed(name, keys), num_steps=steps)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if trial >= warmup:
                out[name]["wall"].append(tokens / dt)
                out[name]["cpu"].append(tokens / dc)
        # The same batches read alone: through a stream (grain), from memory.
        t0 = time.perf_counter()
        batches = [b.tokens for b in itertools.islice(streams["read"], steps)]
        dt_grain = time.perf_counter() - t0
        t0 = time.perf_counter()
        for c, i in keys:
            memory.batch(c, i)
        dt_memory = time.perf_counter() - t0
        assert np.array_equal(batches[-1], memory.batch(*keys[-1]))
        if trial >= warmup:
            for name in ("grain", "grain+prefetch"):
                out[name]["read"].append(dt_grain / steps)
            out["memory"]["read"].append(dt_memory / steps)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="steps per trial (= H)")
    parser.add_argument("--trials", type=int, default=61)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=0, help="use the first N chunks (0: all)")
    parser.add_argument("--tiny", action="store_true", help="a harness check (see above)")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "PATH", "BATCH", "SEQ"))
    args = parser.parse_args(argv)
    if args.child:
        mode, path, batch, seq = args.child
        child(mode, path, int(batch), int(seq))
        return 0
    if args.tiny:
        args.steps, args.trials, args.warmup, args.chunks = 2, 1, 1, 8

    from dipsjax.data import train_chunks
    from dipsjax.data.records import write_chunks

    t_start = time.perf_counter()
    chunks = train_chunks("austen", args.chunk_len)
    if args.chunks:
        chunks = chunks[: args.chunks]
    folder = Path(tempfile.mkdtemp(prefix="dipsjax-data-bench-"))

    rates = throughput(
        chunks,
        folder,
        batch_size=args.batch,
        seq_len=args.seq,
        steps=args.steps,
        trials=args.trials,
        warmup=args.warmup,
    )

    def paired(kind: str, name: str = "grain") -> list[float]:
        return [g / m for g, m in zip(rates[name][kind], rates["memory"][kind], strict=True)]

    ratios = {name: paired("wall", name) for name in ("grain", "grain+prefetch")}
    ratio = {name: statistics.median(r) for name, r in ratios.items()}

    memory: dict[str, dict[int, dict]] = {"grain": {}, "memory": {}}
    modes = ("grain",) if args.tiny else ("grain", "memory")
    for k in SIZES:
        # Written as a stream: the writer never holds the repeated corpus either.
        path = folder / f"x{k}.array_record"
        write_chunks(path, (c for _ in range(k) for c in chunks))
        for mode in modes:
            memory[mode][k] = run_child(mode, path, args.batch, args.seq)
        path.unlink()
    elapsed = time.perf_counter() - t_start

    n = chunks.shape[0]
    print(
        f"corpus: austen train, {n} chunks of {args.chunk_len} byte tokens "
        f"({chunks.nbytes / 2**20:.1f} MiB as int32); batch {args.batch} x seq {args.seq}; "
        f"tiny LLaMA, {args.steps} steps/trial, {args.trials} trials (+{args.warmup} warm-up); "
        f"{elapsed:.1f}s"
    )
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in rates.items()}
    for name in ARMS:
        r = sorted(rates[name]["wall"])
        print(
            f"  {name:14s} median {med[name]['wall']:>8,.0f} tok/s   min {r[0]:>8,.0f}   "
            f"max {r[-1]:>8,.0f}   (per CPU second: {med[name]['cpu']:,.0f}; a batch read "
            f"alone: {med[name]['read'] * 1e6:.0f} us)"
        )
    for name in ("grain", "grain+prefetch"):
        print(f"  per-trial ratios {name}/memory: {' '.join(f'{x:.3f}' for x in ratios[name])}")
        best = max(rates[name]["wall"]) / max(rates["memory"]["wall"])
        print(
            f"  {name}/memory: ratio of the best trials {best:.3f}, per CPU second (median "
            f"of trials) {statistics.median(paired('cpu', name)):.3f}"
        )
    step_s = args.batch * args.seq / med["memory"]["wall"]
    extra = med["grain"]["read"] - med["memory"]["read"]
    print(
        f"  a step takes {step_s * 1e3:.1f} ms, grain reads a batch {extra * 1e6:+.0f} us "
        f"slower than memory: {step_s / (step_s + extra):.4f} if nothing overlapped"
    )
    for mode in modes:
        label = "RecordChunks (grain)" if mode == "grain" else "TokenChunks (all in RAM)"
        print(f"resident memory reading every batch, {label}:")
        for k, m in memory[mode].items():
            print(
                f"  {k:2d}x ({n * k:6d} chunks, {m['batches']:6d} batches, "
                f"{m['batches'] / m['seconds']:,.0f} batch/s): after imports "
                f"{m['base']['rss'] / 1024:6.1f} MiB, at the end {m['end']['rss'] / 1024:6.1f} "
                f"MiB, peak {m['end']['peak'] / 1024:6.1f} MiB"
            )
    for mode in modes:
        growth = ", ".join(
            f"{k}x {(m['end']['peak'] - m['base']['rss']) / 1024:+.1f} MiB"
            for k, m in memory[mode].items()
        )
        print(f"  {mode}: peak over the process after its imports: {growth}")
    g = memory["grain"]
    assert len({m["checksum"] // k for k, m in g.items()}) == 1, "the copies read differently"
    rss_ratio = g[16]["end"]["peak"] / g[1]["end"]["peak"]
    print(
        f"data_grain_prefetch_memory_ratio: {ratio['grain+prefetch']:.3f} (grain reading "
        f"{PREFETCH} batches ahead in a thread, read inside the round)"
    )
    print(f"data_grain_prefetch_tokens_per_s: {med['grain+prefetch']['wall']:.0f}")
    print(f"data_grain_tokens_per_s: {med['grain']['wall']:.0f}")
    print(f"data_memory_tokens_per_s: {med['memory']['wall']:.0f}")
    print(f"data_grain_memory_ratio: {ratio['grain']:.3f} (goal: >= {RATIO_GOAL})")
    print(
        f"data_rss_ratio_16x: {rss_ratio:.3f} (peak {g[1]['end']['peak'] / 1024:.1f} MiB at "
        f"1x, {g[16]['end']['peak'] / 1024:.1f} MiB at 16x; goal: <= {RSS_GOAL})"
    )
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
