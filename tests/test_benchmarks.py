"""Every script in ``benchmarks/`` runs in its tiny form, so that none rots unseen.

Each runs as its own process (``sys.executable``, from the repository root) and must end
with the ``name: value (goal: ...)`` lines it promises, each value a finite number. The
tiny forms check the harness, not the figures (they are too small and the machine too
shared for those to mean anything), except where a figure is exact (counts, a
deterministic ablation).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURE = re.compile(r"^([a-z0-9_]+): (\S+) \((?:[^)]*; )?goal: .*\)$")  # ...; goal: ...


def run_benchmark(name: str, *args: str, timeout: float, tmp_path: Path) -> dict[str, float]:
    """Runs ``benchmarks/NAME.py ARGS`` and returns the figures its output ends with."""
    # As a user runs it: without the 8 host devices tests/conftest.py forces on this process.
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env = dict(
        os.environ,
        XLA_FLAGS=" ".join(flags),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        JAX_PLATFORMS="cpu",
        TMPDIR=str(tmp_path),  # the run directories the scripts make go with the test
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{out[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    figures: dict[str, float] = {}
    for line in reversed(lines):  # the trailing block of figure lines
        match = FIGURE.match(line)
        if not match:
            break
        figures[match[1]] = float(match[2])
    assert figures, f"{name} ends with no 'name: value (goal: ...)' line:\n{out[-4000:]}"
    for key, value in figures.items():
        assert math.isfinite(value), f"{name}: {key} = {value}"
    return figures


def expect(figures: dict[str, float], names: list[str]) -> None:
    assert sorted(figures) == sorted(names), figures


def test_solo_server_reference_round_measures_against_its_start():
    # LearnerNode.solo (system.py's baseline) asks for a round with base=None; with the
    # server reference (Di-PS) that crashed in pseudo_gradient. A learner that never took a
    # version measures against the parameters it started from (here: its only round's start).
    import jax
    import numpy as np

    from dipsjax.runtime.partition import Compute, Partition
    from tests.runtime.test_compute_wire import tiny_learner

    learner = tiny_learner()
    compute = Compute(learner, "server", Partition())
    with pytest.raises(ValueError, match="version it started from"):
        compute.call("round", [np.zeros((8, 17), np.int32)] * 2, 2, None)
    compute.call("warm_up", np.zeros((8, 17), np.int32), 2)  # a sample batch
    start = jax.device_get(learner.params_dict())
    batches = [np.random.default_rng(i).integers(0, 256, (8, 17), np.int32) for i in range(2)]
    _, delta = compute.call("round", batches, 2, None)
    end = jax.device_get(learner.params_dict())
    for s, e, d in zip(*(jax.tree.leaves(t) for t in (start, end, delta)), strict=True):
        np.testing.assert_allclose(d, np.asarray(s, np.float32) - e, rtol=1e-6, atol=1e-7)
    assert any(np.abs(d).max() > 0 for d in jax.tree.leaves(delta))
    compute.call("take", start, 1, False, None)  # a version taken: base is needed again
    with pytest.raises(ValueError, match="version it started from"):
        compute.call("round", batches, 2, None)


def test_anomaly_ablation(tmp_path):
    # Already small (3 streams x 5 rules x 400 rounds of NumPy): it runs whole, and its
    # figures are deterministic, so they are checked as the README quotes them.
    fig = run_benchmark("anomaly_ablation", timeout=120, tmp_path=tmp_path)
    expect(
        fig,
        [
            f"anomaly_{k}_{r}"
            for k in ("outliers_rejected", "false_rejections")
            for r in ("ours", "paper")
        ],
    )
    assert fig["anomaly_outliers_rejected_ours"] == 1.0
    assert fig["anomaly_false_rejections_ours"] == 0.0
    assert fig["anomaly_outliers_rejected_paper"] == 0.0


def test_goodput(tmp_path):
    # Already small (a Monte-Carlo timed in well under a second): it runs whole.
    fig = run_benchmark("goodput", timeout=120, tmp_path=tmp_path)
    expect(fig, ["goodput_1p2m_30d_seconds"])
    assert fig["goodput_1p2m_30d_seconds"] > 0


def test_outer_update_tiny(tmp_path):
    fig = run_benchmark("outer_update", "--tiny", timeout=120, tmp_path=tmp_path)
    expect(fig, ["outer_update_ms", "outer_update_bandwidth_ratio"])
    assert fig["outer_update_ms"] > 0 and fig["outer_update_bandwidth_ratio"] > 0


def test_learner_mfu_tiny(tmp_path):
    fig = run_benchmark("learner_mfu", "--tiny", timeout=180, tmp_path=tmp_path)
    expect(fig, ["learner_step_ratio", "learner_round_ratio", "plain_mfu", "step_mfu", "round_mfu"])
    assert 0 < fig["step_mfu"] < 1 and 0 < fig["plain_mfu"] < 1
    assert all(v > 0 for v in fig.values())


def test_learner_memory_tiny(tmp_path):
    # The harness: the tiny model's bytes are lost in the allocator's, so no ratio is judged.
    fig = run_benchmark("learner_memory", "--tiny", "--run-step", timeout=300, tmp_path=tmp_path)
    expect(
        fig,
        [
            "learner_memory_ratio_runtime",
            "learner_memory_ratio_donate",
            "learner_memory_xla_step_gb_remat_none",
            "learner_memory_xla_step_gb_remat_full",
            "learner_memory_xla_step_gb_remat_full_scan",
            "learner_memory_step_peak_gb",
            "learner_memory_step_compiles",
        ],
    )
    assert all(v > 0 for v in fig.values())
    # Two steps from a fresh learner, one compiled program.
    assert fig["learner_memory_step_compiles"] == 1
    # XLA's plan: recomputing every block keeps less than keeping every activation.
    assert (
        fig["learner_memory_xla_step_gb_remat_full"] < fig["learner_memory_xla_step_gb_remat_none"]
    )


def test_scan_layers_tiny(tmp_path):
    fig = run_benchmark("scan_layers", "--tiny", timeout=300, tmp_path=tmp_path)
    expect(fig, ["scan_compile_ratio", "scan_scratch_ratio", "scan_step_ratio"])
    assert all(v > 0 for v in fig.values())


@pytest.mark.parametrize("tie", [False, True])
def test_model_flops_a_token_match_what_xla_counts(tie, monkeypatch):
    # The MFU numerator (6 per matmul parameter plus attention) against XLA's own count of
    # the compiled forward and backward: elementwise work is the only difference (< 2%).
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from dipsjax.model import Llama, get_config

    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.learner_mfu import flops_per_token

    seq = 64
    cfg = get_config(
        "small",
        d_model=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        d_ff=768,
        max_seq_len=seq,
        tie_embeddings=tie,
    )
    graphdef, params = nnx.split(Llama(cfg, rngs=nnx.Rngs(0)), nnx.Param)

    def loss(p, b):
        logits = nnx.merge(graphdef, p)(b[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b[:, 1:]).mean()

    batch = jnp.zeros((8, seq + 1), jnp.int32)
    cost = jax.jit(jax.grad(loss)).lower(params, batch).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    n = sum(x.size for x in jax.tree.leaves(params))
    assert cost["flops"] / (8 * seq) / flops_per_token(cfg, n, seq) == pytest.approx(1, abs=0.02)


def test_dataplane_tiny(tmp_path):
    fig = run_benchmark("dataplane", "--tiny", timeout=180, tmp_path=tmp_path)
    expect(
        fig,
        [
            "dataplane_push_pull_ratio",
            "dataplane_tls_ratio",
            "dataplane_host_bf16_ratio",
            "dataplane_host_bf16_tls_ratio",
            "dataplane_bare_tls_ratio",
            "dataplane_push_streams",
            "dataplane_pull_streams",
        ],
    )
    # Nothing about speed (the ratios are a loaded machine's): only that transfers stream.
    # A push whose learner encodes every tensor before sending any, or a pull the follower
    # encodes (or the learner receives) whole before the learner gets its first tensor,
    # scores 0: the check waits on events, not timings (benchmarks/dataplane.py _streams).
    assert fig["dataplane_push_streams"] == 1, fig
    assert fig["dataplane_pull_streams"] == 1, fig


@pytest.mark.parametrize("form", ["runtime", "host"])
def test_the_streaming_check_scores_a_serializing_data_plane_0(monkeypatch, form):
    # The check can fail: with every pipeline made to finish its whole input before handing
    # anything on (a sender that encodes the transfer before sending any of it, a reader
    # that receives it all before the sink sees a tensor), both figures are 0.
    import importlib.util

    from dipsjax.transport import dataplane as dp

    spec = importlib.util.spec_from_file_location(
        "dataplane_bench", ROOT / "benchmarks/dataplane.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench._streams(form, seconds=20.0) == (1, 1)
    monkeypatch.setattr(dp, "_pipelined", lambda items, fn, depth=2: iter([fn(x) for x in items]))
    assert bench._streams(form, seconds=0.5) == (0, 0)


@pytest.mark.slow
@pytest.mark.integration
def test_control_plane_tiny(tmp_path):
    fig = run_benchmark("control_plane", "--tiny", timeout=300, tmp_path=tmp_path)
    expect(fig, ["control_decision_p99_ms_saturated", "control_heartbeat_p99_ms_saturated"])
    assert all(v > 0 for v in fig.values())


@pytest.mark.slow
@pytest.mark.integration
def test_load_tiny(tmp_path):
    fig = run_benchmark("load", "--tiny", timeout=400, tmp_path=tmp_path)
    expect(
        fig,
        [
            "control_plane_p99_ms_idle",
            "control_plane_p99_ms_saturated",
            "load_tokens_lost",
            "load_pushes_outside_a_round",
        ],
    )
    # Exact even in the tiny form: nothing lost, every push in a round.
    assert fig["load_tokens_lost"] == 0
    assert fig["load_pushes_outside_a_round"] == 0
    assert fig["control_plane_p99_ms_idle"] > 0 and fig["control_plane_p99_ms_saturated"] > 0


@pytest.mark.slow
@pytest.mark.integration
def test_round_1b_tiny(tmp_path):
    fig = run_benchmark("round_1b", "--tiny", "--checkpoints", timeout=400, tmp_path=tmp_path)
    expect(
        fig,
        ["round_1b_peak_resident_gib", "round_1b_push_s", "round_1b_update_s", "round_1b_pull_s"],
    )
    assert fig["round_1b_peak_resident_gib"] > 0
    assert all(fig[f"round_1b_{p}_s"] >= 0 for p in ("push", "update", "pull"))


@pytest.mark.slow
def test_sim_comparison_tiny(tmp_path):
    fig = run_benchmark("sim_comparison", "--tiny", timeout=400, tmp_path=tmp_path)
    expect(
        fig,
        [
            "dips_vs_sync_throughput_eta200",
            "weak_scaling_efficiency_dips_4",
            "weak_scaling_efficiency_sync_diloco_4",
        ],
    )
    assert fig["dips_vs_sync_throughput_eta200"] > 0
    # Aggregate over ideal throughput: a share.
    assert all(0 < fig[f"weak_scaling_efficiency_{m}_4"] <= 1 for m in ("dips", "sync_diloco"))


@pytest.mark.slow
@pytest.mark.integration
def test_system_tiny(tmp_path):
    # Its solo learners (the baseline) crashed in pseudo_gradient with base=None.
    fig = run_benchmark("system", "--tiny", timeout=500, tmp_path=tmp_path)
    ratios = ["system_tokens_ratio_waiting", "system_tokens_ratio_overlap"]
    added = ["system_added_time_waiting", "system_added_time_overlap"]
    expect(fig, ratios + added)
    assert all(fig[k] > 0 for k in ratios) and all(0 <= fig[k] < 1 for k in added)


def test_added_time_is_the_share_of_each_span_not_training(tmp_path, monkeypatch):
    # Learner 0 trains 10 s, pushes at 10, trains 10 s again and pushes at 25 (5 s between
    # them not training): 5 / 25. Learner 1's second push was dropped and still counts:
    # trains 4 s, pushes at 6 (2 s before it started), 4 s more, pushes at 12: 2 / 10.
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.system import added_time, idle_per_round

    def push(j, at, train):
        return {
            "learner": j,
            "pushed_at": at,
            "staleness": 0,
            "meta": {
                "tokens": 1,
                "steps": 1,
                "base_version": 0,
                "incarnation": 0,
                "train_seconds": train,
                "pulled": True,
                "start_chunk": None,
                "start_offset": 0,
                "spans": [],
            },
        }

    rounds = [
        ([push(0, 10.0, 10.0), push(1, 6.0, 4.0)], []),
        ([push(0, 25.0, 10.0)], [push(1, 12.0, 4.0)]),
    ]
    with open(tmp_path / "tape.jsonl", "w") as f:
        for i, (parts, dropped) in enumerate(rounds):
            f.write(
                json.dumps(
                    {
                        "kind": "round",
                        "round_id": i,
                        "version": i + 1,
                        "applied": True,
                        "participants": parts,
                        "dropped": dropped,
                        "vector_clock": {},
                        "sq_norms": [],
                        "scores": [],
                        "threshold": None,
                        "accepted": [],
                        "weights": [],
                        "clip_factor": None,
                        "merged_sq_norm": 0.0,
                        "grace": 0.0,
                        "grace_policy": {},
                        "timings": {},
                    }
                )
                + "\n"
            )
    shares = added_time(tmp_path / "tape.jsonl")
    assert shares == pytest.approx({0: 5 / 25, 1: 2 / 10})
    # ... and in seconds between rounds: one gap each, of 5 s and 2 s.
    assert idle_per_round(tmp_path / "tape.jsonl") == pytest.approx({0: 5.0, 1: 2.0})


@pytest.mark.slow
@pytest.mark.integration
def test_recovery_tiny(tmp_path):
    # Two roles: every role is a whole run (minutes on 2 shared cores); the learner and the
    # leader differ only in what the script watches for (``--roles learner leader``). The
    # takeover (a standby leader, issue 22) watches its own records.
    fig = run_benchmark(
        "recovery", "--tiny", "--roles", "follower", "takeover", timeout=500, tmp_path=tmp_path
    )
    roles = ("follower", "takeover")
    names = [f"recovery_{r}_{k}_s" for r in roles for k in ("detect", "recover")]
    expect(fig, [*names, "recovery_takeover_rounds_again_s"])
    for r in roles:  # detected before (or as) it recovered, both after the kill
        assert 0 <= fig[f"recovery_{r}_detect_s"] <= fig[f"recovery_{r}_recover_s"]
    # A new round is applied only once the standby has taken over and resumed.
    assert fig["recovery_takeover_detect_s"] < fig["recovery_takeover_rounds_again_s"]


def test_chaos_knows_a_process_only_once_it_joined(monkeypatch):
    # A role killed twice: the second process counts as known to the leader only if a tape
    # record after the first kill is its join (it once measured its successor's start-up
    # as a 6.1 s detection). Losses, activity and other roles' joins do not count.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # (it imports _live as a script)
    from chaos import _joined, _joined_between

    assert _joined({"kind": "follower", "follower": 1, "event": "joined"}, "follower1")
    assert not _joined({"kind": "follower", "follower": 1, "event": "lost"}, "follower1")
    assert not _joined({"kind": "follower", "follower": 0, "event": "joined"}, "follower1")
    assert _joined({"kind": "membership", "learner": 2, "event": "join"}, "learner2")
    assert not _joined({"kind": "membership", "learner": 2, "event": "active"}, "learner2")
    assert not _joined({"kind": "membership", "learner": 2, "event": "restart"}, "learner2")
    # Only records after the first kill count: the first process's own join does not.
    tape = [
        {"kind": "follower", "follower": 1, "event": "joined"},  # the first process
        {"kind": "follower", "follower": 1, "event": "lost"},
    ]
    first, second = {"role": "follower1", "n": 1}, {"role": "follower1", "n": 2}
    assert not _joined_between(tape, first, second)
    tape.append({"kind": "follower", "follower": 1, "event": "joined"})  # the second one
    assert _joined_between(tape, first, {"role": "follower1", "n": 3})


def test_chaos_counts_an_idle_standby_paused_as_back_once_it_runs_again(monkeypatch):
    # Nobody watches an idle standby, so a pause of it has nothing to detect: it was once
    # counted as not survived (chaos --standby --seed 11: 7 of 8), the run fine. It is back
    # once woken as the same process; a restart (it died meanwhile) is not that.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from chaos import Chaos

    chaos = object.__new__(Chaos)
    pids = {"standby": 7}
    monkeypatch.setattr(chaos, "pids", lambda: pids, raising=False)
    fault = {"role": "standby", "moment": "pause", "pid": 7, "watched": False, "idle": True}
    assert chaos._gone_back("standby", [], fault) == (None, None)  # still paused
    fault["woken"] = True
    assert chaos._gone_back("standby", [], fault) == (None, True)
    pids["standby"] = 8  # a new process: the paused one died
    assert chaos._gone_back("standby", [], fault) == (None, None)


def test_chaos_leaves_out_of_participation_only_the_windows_a_fault_held_rounds_up_in(
    monkeypatch,
):
    # A follower or the active leader down: no round can be applied, so those windows are
    # left out. An idle standby's fault holds nothing up; its windows still count (they
    # were all left out from an unwatched pause on, whose recovery was never seen).
    import types

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from chaos import Chaos

    chaos = object.__new__(Chaos)
    chaos.spec = types.SimpleNamespace(standby=True)
    chaos.launcher = types.SimpleNamespace(poll=lambda: 0)  # the run over: nothing to watch
    chaos.down, chaos.outages = {0: []}, []

    def fault(role: str, idle: bool = False) -> dict:
        return {"role": role, "t": 5.0, "idle": idle}

    chaos.watch([fault("standby", idle=True), fault("leader", idle=True)])
    assert chaos.outages == []
    chaos.watch([fault("standby"), fault("follower1"), fault("learner0")])
    assert chaos.outages == [[5.0, float("inf")]] * 2
    assert chaos.down[0] == [[5.0, float("inf")]]


@pytest.mark.slow
@pytest.mark.integration
def test_chaos_tiny(tmp_path):
    # One run: a follower killed in an outer step, a learner mid-push. The counts are exact:
    # both faults survived, the run at its budget, nothing lost, trained twice or diverged.
    fig = run_benchmark("chaos", "--tiny", timeout=600, tmp_path=tmp_path)
    assert fig["chaos_faults"] == fig["chaos_faults_survived"] == 2
    for name in ("runs_unfinished", "tokens_lost", "batches_lost", "batches_twice"):
        assert fig[f"chaos_{name}"] == 0, name
    assert fig["chaos_version_faults"] == 0
    for role in ("follower", "learner"):  # detected before (or as) it recovered
        assert 0 <= fig[f"chaos_{role}_detect_s"] <= fig[f"chaos_{role}_recover_s"]
    assert 0 < fig["chaos_participation"] <= 1


@pytest.mark.slow
@pytest.mark.integration
def test_chaos_tiny_with_a_standby_leader(tmp_path):
    # Either leader: the active one killed in an outer step, then the standby that took
    # over paused mid-push (the schedule that found a deposed leader's answer counted as a
    # booked push). Exact counts, as above; each leader's loss detected within its lease.
    fig = run_benchmark("chaos", "--tiny", "--standby", timeout=600, tmp_path=tmp_path)
    assert fig["chaos_faults"] == fig["chaos_faults_survived"] == 2
    for name in ("runs_unfinished", "tokens_lost", "batches_lost", "batches_twice"):
        assert fig[f"chaos_{name}"] == 0, name
    assert fig["chaos_version_faults"] == 0
    for role in ("leader", "standby"):
        assert 0 <= fig[f"chaos_{role}_detect_s"] <= fig[f"chaos_{role}_recover_s"]
        assert fig[f"chaos_{role}_detect_s"] < 5.0


@pytest.mark.slow
@pytest.mark.integration
def test_hostile_tiny(tmp_path):
    # A short calm window and a short attack window on a live job, then a learner killed
    # under attack. Exact counts: nothing forged or replayed taken, the learner back, the
    # run at its budget with nothing lost, every refusal counted by the side that refused.
    fig = run_benchmark("hostile", "--tiny", timeout=600, tmp_path=tmp_path)
    assert fig["hostile_accepted"] == 0
    assert fig["hostile_probe_failures"] == 0
    assert fig["hostile_learners_back"] == 1.0
    assert fig["hostile_run_finished"] == 1
    assert fig["hostile_tokens_lost"] == 0
    assert fig["hostile_batches_lost_or_twice"] == 0
    # Half-open handshakes, counted: as ``tls`` when the attacker hangs up first, as
    # ``first_frame`` when the follower's deadline ends them first (a race in a 4 s window).
    half_open = ("hostile_refused_follower_tls", "hostile_refused_follower_first_frame")
    assert sum(fig.get(k, 0) for k in half_open) > 0
    assert fig["hostile_refused_follower_frame"] > 0  # malformed frames, counted
    assert fig["hostile_refused_follower_ticket"] > 0  # pushes for rounds never opened
    assert fig["hostile_throughput_ratio"] > 0 and fig["hostile_control_p99_ms"] > 0


def test_data_pipeline_tiny(tmp_path):
    # Learner rounds fed through grain (ArrayRecord) and from memory, then three fresh
    # processes reading a 1x, 4x and 16x corpus: the harness, not the figures.
    fig = run_benchmark("data_pipeline", "--tiny", timeout=300, tmp_path=tmp_path)
    expect(fig, ["data_grain_memory_ratio", "data_rss_ratio_16x"])
    assert fig["data_grain_memory_ratio"] > 0
    # Peak resident memory at 16x over 1x: two sizes of one process kind (the tiny corpus
    # is 2 MiB at 16x, so even all of it in memory would stay near 1).
    assert 0.5 < fig["data_rss_ratio_16x"] < 2


def test_tokenizers_tiny(tmp_path):
    # The demo on a byte-level BPE and on bytes at equal training bytes: one BPE round of 2
    # learners (H = 4) against the byte rounds covering as many bytes.
    fig = run_benchmark("tokenizers", "--tiny", timeout=500, tmp_path=tmp_path)
    expect(fig, ["val_bpb_byte", "val_bpb_bpe1024", "train_bytes_byte", "train_bytes_bpe1024"])
    assert all(v > 0 for v in fig.values())
    # Whole rounds each: the byte run's rounds are the nearest to the BPE's bytes.
    assert abs(fig["train_bytes_byte"] / fig["train_bytes_bpe1024"] - 1) < 0.25


def test_ladder(tmp_path):
    # Two rounds of M = 1 and 2 at H = 2, one seed. Exact where the figure is: one learner
    # with outer SGD at lr 1 (no momentum) is data parallel's continuous AdamW, so its gap
    # to DP is zero up to the BF16 wire. A second call resumes: nothing is run again.
    out = tmp_path / "ladder"
    fig = run_benchmark("ladder", "--tiny", "--out", str(out), timeout=300, tmp_path=tmp_path)
    expect(fig, ["ladder_runs", "ladder_sync_diloco_gap_m1"])
    assert fig["ladder_runs"] == 4
    assert abs(fig["ladder_sync_diloco_gap_m1"]) < 1e-3
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4 and (out / "ladder.md").is_file()
    # A result of another invocation (data parallel at H = 4, the same tokens), as a second
    # grid leaves it.
    other = json.loads(next(x for x in lines if json.loads(x)["label"] == "dp"))
    other.update(key=other["key"].replace('"inner_steps": 2', '"inner_steps": 4'), h=4)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(other) + "\n")

    def cells() -> set[tuple[str, ...]]:
        rows = [r for r in (out / "ladder.md").read_text().splitlines() if r.startswith("| ")]
        return {tuple(c.strip() for c in r.split("|")[1:6]) for r in rows[1:]}

    tiny = {(lb, m, "2", "2", "0") for lb in ("dp", "sync_diloco") for m in ("1", "2")}
    # again: nothing run; the report is this grid's, without the other invocation's row
    again = run_benchmark("ladder", "--tiny", "--out", str(out), timeout=120, tmp_path=tmp_path)
    assert again == fig and len((out / "results.jsonl").read_text().splitlines()) == 5
    assert cells() == tiny
    # and reporting every result the folder holds: one row per method, M, H and rounds
    args = ("--tiny", "--out", str(out), "--report-all")
    again = run_benchmark("ladder", *args, timeout=120, tmp_path=tmp_path)
    assert again == fig and len((out / "results.jsonl").read_text().splitlines()) == 5
    assert cells() == tiny | {("dp", "1", "4", "1", "0")}  # its tokens: 1 round at H = 4


def test_quality_tiny(tmp_path):
    # Two of the comparisons in tiny form (2 rounds, H=2, one seed): each figure is the
    # relative gap of the two runs' final bits per byte in the results file, recomputed
    # here; Di-PS's pair runs at eta 100, so its time ratio is reported beside the gap.
    out = tmp_path / "quality"
    args = ("--tiny", "--out", str(out), "--only", "sync_vs_dp_m1", "dips_vs_sync_eta100")
    fig = run_benchmark("quality", *args, timeout=300, tmp_path=tmp_path)
    expect(
        fig,
        ["sync_vs_dp_m1_gap", "dips_vs_sync_eta100_gap", "dips_vs_sync_eta100_time_ratio"],
    )
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    by = {(r["label"], r["m"]): r for r in rows}
    sync1, dp1 = by[("sync_diloco", 1)], by[("dp", 1)]
    assert fig["sync_vs_dp_m1_gap"] == pytest.approx(sync1["bpb"] / dp1["bpb"] - 1, abs=1e-4)
    dips, sync2 = by[("dips", 2)], by[("sync_diloco", 2)]
    assert fig["dips_vs_sync_eta100_gap"] == pytest.approx(dips["bpb"] / sync2["bpb"] - 1, abs=1e-4)
    ratio = dips["virtual_time"] / sync2["virtual_time"]
    assert fig["dips_vs_sync_eta100_time_ratio"] == pytest.approx(ratio, abs=1e-4)
