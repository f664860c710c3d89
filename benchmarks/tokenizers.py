"""The built-in demo on a subword tokenizer against the byte tokenizer, at equal training
bytes.

Two simulated Di-PS runs of the quickstart's settings, scaled down (4 learners of speeds 1,
1.3, 1.6 and 2, 2 followers, the tiny model, batches of 8 x 64 tokens, H = 16 inner steps,
inner AdamW at 3e-3, outer Nesterov 0.7 / 0.8) on Austen: one with the byte tokenizer
(``task_args={"tokenizer": "byte"}``), one with a byte-level BPE trained on the train split
(``"bpe:<vocab>"``, the model's vocabulary following it), on the same number of corpus
bytes: the BPE run trains ``--rounds`` rounds (a round: 16 steps of each learner), the byte
run as many whole rounds as cover the same bytes (the BPE's rounds times its bytes per
token on the train split, to the nearest round: 25 rounds for 9 of bpe:1024's 2.76 bytes
a token, within 0.5% of its bytes). Each run reports its validation
bits per byte on the fixed validation set (``eval_tokens=32768`` tokens in windows spread
over all of *Persuasion*; so about 2.8 times as many bytes of it for the BPE), exact over
the bytes its scored targets spell, and the corpus bytes it trained on (tokens trained
times bytes per token).

Run: ``.venv/bin/python benchmarks/tokenizers.py [--vocab 1024] [--rounds 9]``
(``--tiny``: a harness check, 2 learners, H = 4, one BPE round; its figures mean nothing).
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder comes first on sys.path, where this file would hide
# the Hugging Face ``tokenizers`` package the subword tokenizer imports.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import math
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=1024, help="BPE vocabulary size")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of the BPE run")
    parser.add_argument("--tiny", action="store_true", help="a harness check (see above)")
    args = parser.parse_args()
    if args.tiny:  # every run compiles its programs again: load them from a cache
        import tempfile

        import jax

        jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="dipsjax-tok-"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    from dipsjax.data import load_corpus, load_tokenizer
    from dipsjax.sim.simulator import SimConfig, simulate

    learners, h, rounds = (2, 4, 1) if args.tiny else (4, 16, args.rounds)
    common = dict(
        method="dips",
        learners=learners,
        followers=2,
        model="tiny",
        corpus="austen",
        batch_size=8,
        seq_len=64,
        chunk_len=4096,
        inner_steps=h,
        inner_lr=3e-3,
        outer_lr=0.7,
        outer_momentum=0.8,
        speeds=(1.0, 1.3, 1.6, 2.0)[:learners],
        wire="bf16",
        eval_every=1000,  # the final evaluation only
        eval_tokens=1024 if args.tiny else 32768,
        seed=0,
    )
    round_tokens = learners * h * 8 * 64  # a round of every learner
    spec = f"bpe:{args.vocab}"
    t0 = time.perf_counter()
    bpe = load_tokenizer(spec, corpus="austen")
    train_texts = load_corpus("austen", "train").texts
    bpt = bpe.bytes_per_token(train_texts)  # of the train split, documents encoded alone
    # Whole rounds each (a run stops at the end of a round): the byte run trains on as
    # many rounds as the BPE's rounds cover bytes, the nearest whole number.
    bpe_budget = rounds * round_tokens
    byte_budget = max(1, round(rounds * bpt)) * round_tokens
    print(
        f"{spec}: {bpe.vocab_size} ids, {bpt:.4f} bytes a token on the train split "
        f"(trained or loaded in {time.perf_counter() - t0:.1f} s)",
        flush=True,
    )
    label = f"bpe{args.vocab}"
    results = {}
    for name, tok, budget, per_token in (
        ("byte", "byte", byte_budget, 1.0),
        (label, spec, bpe_budget, bpt),
    ):
        t = time.perf_counter()
        res = simulate(SimConfig(token_budget=budget, task_args={"tokenizer": tok}, **common))
        trained = res.tokens_trained * per_token
        results[name] = (res.final_bpb, trained)
        print(
            f"{name}: budget {budget} tokens, {res.rounds} rounds, trained "
            f"{res.tokens_trained:.0f} tokens = {trained:.0f} bytes; val loss "
            f"{res.final_loss:.4f} nats/token, {res.final_bpb:.4f} bits/byte "
            f"(wall {time.perf_counter() - t:.0f} s)",
            flush=True,
        )
    print(f"(wall {time.perf_counter() - t0:.0f} s)")
    (bpb_byte, bytes_byte), (bpb_bpe, bytes_bpe) = results["byte"], results[label]
    assert all(math.isfinite(v) for v in (bpb_byte, bpb_bpe))
    print(f"val_bpb_byte: {bpb_byte:.4f} (goal: the byte-level reference)")
    print(f"val_bpb_{label}: {bpb_bpe:.4f} (goal: < byte's at equal bytes)")
    print(f"train_bytes_byte: {bytes_byte:.0f} (goal: = {label}'s)")
    print(f"train_bytes_{label}: {bytes_bpe:.0f} (goal: = byte's)")


if __name__ == "__main__":
    main()
