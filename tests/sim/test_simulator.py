"""The simulator: replay, determinism, failures, ledgers, and the papers' comparisons.

Numbers reached on these tiny settings (4 learners, tiny model, 196,608-token budget,
seed 0) are printed by ``benchmarks/sim_comparison.py`` and listed in the README.
"""

import dataclasses
import json

import jax
import numpy as np
import pytest

from dipsjax.data import check_invariants, completed_chunks
from dipsjax.sim import experiments
from dipsjax.sim.simulator import SimConfig, replay, simulate, tree_equal
from dipsjax.syncer.methods import METHODS as SYNCER_METHODS

ROUND = 4 * 16 * 8 * 64  # tokens of one full round of 4 learners


def test_replay_from_tape_gives_the_same_parameters():
    cfg = SimConfig(method="dips", eta=100, token_budget=3 * ROUND)
    res = simulate(cfg)
    assert res.rounds >= 3
    # The tape is plain JSON and carries everything a round needs.
    for rec in res.tape.rounds():
        json.dumps(rec)
        assert {
            "participants",
            "vector_clock",
            "accepted",
            "weights",
            "clip_factor",
            "grace",
            "timings",
            "scores",
        } <= set(rec)
    assert tree_equal(replay(cfg, res.tape), res.params)
    # Deterministic for a seed: a second run gives the same tape and parameters.
    again = simulate(cfg)
    assert again.tape.records == res.tape.records
    assert tree_equal(again.params, res.params)


@pytest.mark.parametrize("adopt", ["replace", "delta"])
def test_replay_of_decoupled_learners_that_never_wait(adopt):
    cfg = SimConfig(
        method="decoupled", eta=20, quorum=1, overlap=True, adopt=adopt, token_budget=3 * ROUND
    )
    res = simulate(cfg)
    assert any(not p.meta.pulled for r in res.tape.round_records() for p in r.participants)
    assert tree_equal(replay(cfg, res.tape), res.params)


def test_replay_of_a_sparse_2bit_wire():
    # wire_topk (EXTENSION) without error feedback: each push's sparse 2-bit encoding is a
    # function of its pseudo-gradient alone, so the tape replays to the same parameters.
    cfg = SimConfig(method="dips", eta=50, wire="stat2", wire_topk=0.2, token_budget=3 * ROUND)
    res = simulate(cfg)
    assert res.rounds >= 3
    assert tree_equal(replay(cfg, res.tape), res.params)


def test_failure_evicts_rejoins_and_every_token_and_chunk_is_accounted():
    # Learner 1 pulls its first model at ~1.7 s and trains until ~20 s: it crashes mid-round.
    cfg = SimConfig(
        method="dips",
        eta=50,
        token_budget=6 * ROUND,
        failures=((1, 10.0, 90.0),),
        heartbeat_interval=5.0,
    )
    res = simulate(cfg)
    events = [(m["event"], m["learner"]) for m in res.tape.membership()]
    assert ("evict", 1) in events
    assert events.count(("join", 1)) == 2  # joined at start, rejoined after recovery
    rejoin = [m for m in res.tape.membership() if m["event"] == "join" and m["learner"] == 1][1]
    assert rejoin["t"] == pytest.approx(90.0)
    # Token ledger, counted at the learners and at the leader independently.
    assert res.tokens.imbalance() == 0
    assert res.tokens.lost > 0  # the crashed learner's round in training was lost
    assert [m["event"] for m in res.tape.membership() if m["learner"] == 1].count("outage") == 1
    # Chunk ledger: consistent, and no chunk completed twice in an epoch.
    ledger = res.chunk_ledger
    check_invariants(ledger)
    done = completed_chunks(ledger, 0)
    assert len(done) == len(set(done))
    # The others kept training while learner 1 was down.
    during = [r for r in res.tape.rounds() if 10.0 < r["timings"]["opened"] < 90.0]
    assert during and all(1 not in [p["learner"] for p in r["participants"]] for r in during)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"SimConfig\.method"):
        SimConfig(method="gossip")
    with pytest.raises(ValueError, match=r"SimConfig\.bandwidth_gbps"):
        SimConfig(learners=2, bandwidth_gbps=(1.0,))
    with pytest.raises(ValueError, match="failures"):
        SimConfig(failures=((9, 1.0, 2.0),))


def _final(method, **kw):
    return simulate(SimConfig(method=method, token_budget=6 * ROUND, **kw))


@pytest.mark.slow
@pytest.mark.parametrize("eta", [10, 100, 200])
def test_dips_matches_sync_diloco_loss_and_finishes_sooner_under_heterogeneity(eta):
    sync, dips = _final("sync_diloco", eta=eta), _final("dips", eta=eta)
    assert (
        sync.tokens_consumed == dips.tokens_consumed
        or abs(sync.tokens_consumed - dips.tokens_consumed) <= ROUND
    )
    assert dips.final_loss <= 1.02 * sync.final_loss
    if eta >= 100:
        assert dips.virtual_time < sync.virtual_time


@pytest.mark.slow
def test_naive_async_diverges_where_dips_does_not():
    naive, dips = _final("naive_async", eta=200), _final("dips", eta=200)
    assert naive.final_loss > 1.5 * dips.final_loss


@pytest.mark.slow
def test_decoupled_k1_with_grace_no_longer_defeats_the_quorum():
    """Bug: the grace window fed on itself (push intervals hold the previous window), so
    K=1 with grace finished later than K=M. Now, under strong heterogeneity (eta = 100: the
    slowest learner takes twice as long) K=1 finishes sooner than K=M; at the paper's
    heterogeneity (an 18% speed gap plus 10% fluctuation) its window gathers every learner,
    and it ends no later than K=M with a loss within 2%."""
    k1, km = _final("decoupled", quorum=1, eta=100), _final("decoupled", quorum=4, eta=100)
    assert k1.virtual_time < km.virtual_time
    kw = {"eta": 18, "step_noise": 0.1}
    k1, km = _final("decoupled", quorum=1, **kw), _final("decoupled", quorum=4, **kw)
    assert k1.virtual_time <= km.virtual_time
    assert k1.final_loss <= 1.02 * km.final_loss


def test_simulate_command_writes_metrics_tapes_and_plots(tmp_path):
    cfg_file = tmp_path / "sim_tiny.py"
    cfg_file.write_text(
        "import ml_collections\n"
        "def get_config(arg=None):\n"
        "    c = ml_collections.ConfigDict()\n"
        "    c.name = 'sim_tiny'\n"
        f"    c.base = dict(token_budget={ROUND}, eta=50)\n"
        "    c.runs = [dict(label='dips', method='dips'), dict(label='dp', method='dp')]\n"
        "    return c\n"
    )
    out = tmp_path / "out"
    assert experiments.main([str(cfg_file), "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["runs"]) == {"dips", "dp"}
    for run in metrics["runs"].values():
        assert run["tokens_per_second"] > 0 and np.isfinite(run["final_val_loss"])
        assert {"train"} <= set(run["phases"])
    assert (out / "tape_dips.jsonl").read_text().count("\n") >= 1
    for png in ("loss_vs_time.png", "loss_vs_tokens.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_experiment_configs_expand_and_validate():
    for name in (
        "sim_eta",
        "sim_link",
        "sim_weak_scaling",
        "sim_h_sweep",
        "sim_methods",
        "sim_comm",
        "sim_anomaly",
        "sim_wire",
        "sim_adopt",
    ):
        runs = experiments.expand(experiments.load_experiment(name, "ci"))
        assert runs and all(isinstance(c, SimConfig) for _, c in runs)
    cfg = experiments.load_experiment("sim_weak_scaling")
    m16 = dict(experiments.expand(cfg))["dips_m16"]
    assert m16.learners == 16 and m16.speeds[:8] == (1.0,) * 8 and m16.speeds[8] > 1.0
    assert m16.bandwidth_gbps[0] == 1.0
    with pytest.raises(FileNotFoundError, match="known"):
        experiments.load_experiment("sim_nope")


def test_params_are_finite_numpy_trees():
    res = simulate(SimConfig(method="sync_diloco", token_budget=ROUND))
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(res.params))


def test_late_join_pulls_one_version_first_and_leave_stops_contributions():
    cfg = SimConfig(
        method="dips", eta=20, token_budget=5 * ROUND, joins=((3, 40.0),), leaves=((2, 60.0),)
    )
    res = simulate(cfg)
    members = res.tape.membership()
    join3 = next(m for m in members if m["learner"] == 3 and m["event"] == "join")
    active3 = next(m for m in members if m["learner"] == 3 and m["event"] == "active")
    assert join3["t"] == pytest.approx(40.0) and active3["t"] > 40.0
    first = next(p for r in res.tape.round_records() for p in r.participants if p.learner == 3)
    # Its first contribution started from the one complete version it pulled on joining.
    assert first.meta.pulled and first.base_version == active3["pulled_version"]
    assert ("leave", 2) in [(m["event"], m["learner"]) for m in members]
    assert all(
        p["pushed_at"] <= 60.0
        for r in res.tape.rounds()
        for p in r["participants"]
        if p["learner"] == 2
    )
    assert res.tokens.imbalance() == 0


@pytest.mark.parametrize("method", SYNCER_METHODS)
def test_restart_within_a_heartbeat_interval_reaches_the_budget(method):
    """Bug: a learner restarting before its eviction never got a model; a round holding its
    in-flight push waited forever (under sync DiLoCo the run never ended). Learner 1 crashes
    mid-push (t = 19.5 s: its first round trains from ~0.2 s for ~18 s) and is back 2 s
    later, well within one heartbeat interval."""
    cfg = SimConfig(method=method, eta=50, token_budget=4 * ROUND, failures=((1, 19.5, 21.5),))
    res = simulate(cfg)
    assert tree_equal(replay(cfg, res.tape), res.params)
    assert res.tokens.reported >= cfg.token_budget  # the run reached its budget
    events = [(m["event"], m["learner"]) for m in res.tape.membership()]
    assert ("restart", 1) in events and ("evict", 1) not in events
    assert res.tokens.imbalance() == 0
    check_invariants(res.chunk_ledger)
    # The new incarnation pulled a model and contributed again.
    later = [p for r in res.tape.round_records() for p in r.participants if p.learner == 1]
    assert any(p.meta.incarnation == 1 for p in later)


@pytest.mark.parametrize("method", ["dips", "decoupled"])
def test_leader_restored_from_its_snapshot_mid_round_changes_nothing(method):
    cfg = SimConfig(method=method, eta=100, token_budget=3 * ROUND)
    plain = simulate(cfg)
    # Restore at several moments, some of them inside rounds (windows, transfers, pulls).
    times = tuple(float(t) for t in range(5, 100, 7))
    restored = simulate(cfg, restore_leader_at=times)
    assert restored.tape.records == plain.tape.records
    assert tree_equal(restored.params, plain.params)


def test_token_balance_counts_each_side_independently():
    cfg = SimConfig(method="decoupled", eta=100, quorum=1, token_budget=3 * ROUND)
    res = simulate(cfg)
    t = res.tokens
    # Batches drawn at the learners = settled and pending at the leader + never pushed.
    assert t.imbalance() == 0 and t.consumed > t.reported > 0 and t.unpushed > 0
    # The leader's own books: every token reported was settled or is pending.
    assert t.reported == t.applied + t.rejected + t.dropped + t.outstanding


def test_int4_pseudo_gradients_train_as_well_as_bf16():
    """With Delta_start on the wire, int4 stays within 1% of BF16 (Decoupled DiLoCo)."""
    bf16, int4 = _final("dips", eta=100, wire="bf16"), _final("dips", eta=100, wire="int4")
    assert abs(int4.final_loss - bf16.final_loss) <= 0.01 * bf16.final_loss


def test_decentralized_async_diloco_sends_every_pseudo_gradient_to_everyone():
    cfg = SimConfig(method="async_diloco", eta=50, token_budget=2 * ROUND, step_noise=0.0)
    res = simulate(cfg)
    one = cfg.latency + 1e9 * 2 * 8 / (10 * 1e9)  # 1B virtual params in BF16 at 10 Gbps
    # Every push (a round of one learner) went to each of the M - 1 others over its link.
    assert res.comm_time == pytest.approx(res.rounds * (cfg.learners - 1) * one, rel=1e-6)
    assert res.phases["send"] == pytest.approx(res.comm_time)
    # Tokens: drawn at the learners = sent + still training at the end, counted apart.
    assert res.tokens.consumed == res.tokens.reported + res.tokens.unpushed
    assert res.tokens.reported >= cfg.token_budget


def test_simulator_trains_on_a_folder_of_the_users_texts(tmp_path):
    text = "It is a truth universally acknowledged, that a simulator needs data. " * 200
    for name in ("alpha", "beta", "gamma"):
        (tmp_path / f"{name}.txt").write_text(name + ": " + text)
    cfg = SimConfig(
        method="sync_diloco",
        corpus=str(tmp_path),
        validation_doc="gamma",
        chunk_len=512,
        token_budget=2 * ROUND,
        eval_tokens=512,
    )
    res = simulate(cfg)
    assert res.tokens.reported >= cfg.token_budget and np.isfinite(res.final_loss)
    with pytest.raises(ValueError, match="delta"):
        simulate(dataclasses.replace(cfg, validation_doc="delta"))


@pytest.mark.parametrize("method", ["dips", "sync_diloco"])
def test_restart_while_the_round_is_being_decided_pulls_once(method):
    """A restart while its push is past the transfers (norms, merge, apply): the push stays
    merged, the new incarnation pulls through SendModel only (not the round's pull too)."""
    cfg = SimConfig(method=method, eta=50, token_budget=4 * ROUND, failures=((1, 28.05, 29.0),))
    res = simulate(cfg)
    assert res.tokens.imbalance() == 0
    assert tree_equal(replay(cfg, res.tape), res.params)


def test_server_reference_rounds_that_did_not_pull_still_send_theta_now_minus_end():
    """With overlap, a Di-PS learner trains on from its own parameters; it sends
    theta_base - theta_end against the version it last pulled, and replay agrees."""
    cfg = SimConfig(method="dips", eta=50, overlap=True, token_budget=3 * ROUND)
    res = simulate(cfg)
    assert any(not p.meta.pulled for r in res.tape.round_records() for p in r.participants)
    assert res.tokens.imbalance() == 0
    assert tree_equal(replay(cfg, res.tape), res.params)


def test_dips_under_the_quorum_policy_merges_k_pushes_a_round():
    """EXTENSION (docs/benchmarks.md, the Di-PS grace frontier): at eta 100 Di-PS's dynamic
    window is 0, so rounds of a single push occur; under Decoupled DiLoCo's quorum policy
    (K = 3 of 4) every round waits for three learners. (That it still ends sooner than
    synchronous DiLoCo shows over 50 rounds: ``benchmarks/quality.py``.)"""
    kw = dict(eta=100, token_budget=2 * ROUND)
    dyn = simulate(SimConfig(method="dips", **kw))
    q3 = simulate(SimConfig(method="dips", grace="quorum", quorum=3, **kw))
    sizes = [len(r["participants"]) for r in q3.tape.rounds()]
    assert sizes and min(sizes) >= 3, sizes
    assert min(len(r["participants"]) for r in dyn.tape.rounds()) == 1


@pytest.mark.slow
def test_adaptive_steps_gather_every_learner_under_a_quorum_of_one():
    """EXTENSION (``adaptive_steps``): at eta 100 a quorum of 1 leaves the slowest learner
    out of rounds; told to train as many steps as fit until the next beat (the fast ones
    up to 2H, the slow one fewer than H once, to catch up), every learner is in every round
    from the third on, each round's steps follow the learners' speeds, and the run reaches
    K=M's loss within 2% sooner. The books still balance, and replay agrees."""
    kw = dict(method="decoupled", eta=100, token_budget=6 * ROUND, step_noise=0.0)
    plain = simulate(SimConfig(quorum=1, **kw))
    cfg = SimConfig(quorum=1, adaptive_steps=True, **kw)
    res = simulate(cfg)
    km = simulate(SimConfig(quorum=4, **kw))
    rounds = res.tape.round_records()
    assert min(len(r.participants) for r in plain.tape.round_records()) == 1
    assert [len(r.participants) for r in rounds[2:]] == [4] * len(rounds[2:])
    speed = [1 + j / 3 for j in range(4)]  # eta 100: slowdowns spread over [1, 2]
    for r in rounds[3:]:  # every learner measured and in step: H x slowest / own
        steps = {p.learner: p.meta.steps for p in r.participants}
        assert steps == {j: round(16 * 2 / speed[j]) for j in range(4)}, steps
    assert res.virtual_time < km.virtual_time
    assert res.final_loss <= 1.02 * km.final_loss
    assert res.tokens.imbalance() == 0
    assert tree_equal(replay(cfg, res.tape), res.params)


def test_adaptive_steps_need_learners_that_wait_for_their_pull_and_token_weighting():
    with pytest.raises(ValueError, match="adaptive_steps"):
        SimConfig(method="decoupled", adaptive_steps=True, overlap=True)
    with pytest.raises(ValueError, match="adaptive_max must be >= 1 and finite"):
        SimConfig(adaptive_steps=True, adaptive_max=float("inf"))
    # Under uniform weighting a round of 2H steps would count as one of H.
    for method in ("sync_diloco", "naive_async", "dp", "async_diloco"):
        with pytest.raises(ValueError, match="weighs each push by its tokens"):
            SimConfig(method=method, adaptive_steps=True)
