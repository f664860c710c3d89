"""Goodput model: paper anchors, derived constants, checkpoint/restart, Monte-Carlo vs closed
form vs a plain loop."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax.sim import goodput as gp

CHIPS = gp.DEFAULT_CHIPS  # 150k, 300k, 600k, 1.2M, 2.4M
MC_VS_ANALYTIC_POINTS = 1.0  # stated tolerance at the default 30-day horizon
YOUNG_DALY_POINTS = 0.5  # Young/Daly interval vs the best interval, closed form


@pytest.fixture(scope="module")
def table() -> dict[str, dict[int, gp.GoodputResult]]:
    out: dict[str, dict[int, gp.GoodputResult]] = {}
    for label in gp.DEFAULT_METHODS:
        method, learners = gp.parse_method(label)
        out[label] = {n: gp.goodput(chips=n, method=method, learners=learners) for n in CHIPS}
    return out


# ------------------------------------------------------------------------ paper anchors


@pytest.mark.parametrize(
    ("label", "target"), [("elastic_dp", 58.0), ("decoupled_m8", 88.0), ("decoupled_m16", 93.0)]
)
def test_paper_anchors_at_1p2m_chips(table, label, target):
    result = table[label][1_200_000]
    assert abs(result.percent - target) <= 3.0, result
    assert abs(result.analytic_percent - target) <= 3.0, result


def test_elastic_dp_at_2p4m_chips_is_about_40(table):
    assert abs(table["elastic_dp"][2_400_000].percent - 40.0) <= 5.0


def test_mtbf_cluster_is_mtbi_over_chips():
    params = gp.GoodputParams(chips=1_200_000)
    assert params.mtbf_cluster_s == pytest.approx(gp.SECONDS_PER_YEAR / 1_200_000)
    assert params.mtbf_cluster_s == pytest.approx(26.3, abs=0.05)


def test_interruption_count_is_poisson_with_fleet_rate(table):
    for n, result in table["elastic_dp"].items():
        expected = n * result.horizon_s / gp.SECONDS_PER_YEAR
        assert abs(result.interruptions - expected) <= 5 * math.sqrt(expected)
        assert result.recoveries + result.restarts + result.absorbed == result.interruptions


# ------------------------------------------------------------------------ monotonicity


def test_goodput_falls_with_chips_for_every_method(table):
    for label, row in table.items():
        values = [row[n].percent for n in CHIPS]
        assert all(a > b for a, b in itertools.pairwise(values)), (label, values)


def test_decoupled_beats_elastic_dp_and_more_learners_help(table):
    for n in CHIPS:
        dp, m8, m16 = (
            table[lab][n].percent for lab in ("elastic_dp", "decoupled_m8", "decoupled_m16")
        )
        assert dp < m8 < m16 < 100.0, (n, dp, m8, m16)


def test_goodput_rises_with_learners_at_1p2m():
    values = [
        gp.goodput(chips=1_200_000, method="decoupled", learners=m, horizon_days=10).percent
        for m in (1, 2, 4, 8, 16, 32, 64)
    ]
    assert all(a < b for a, b in itertools.pairwise(values)), values
    assert values[-1] > 98.0


def test_decoupled_has_zero_global_downtime(table):
    for label in ("decoupled_m8", "decoupled_m16"):
        for n in CHIPS:
            result = table[label][n]
            limit = 0.0 if n <= 1_200_000 else 60.0  # 2.4M, M = 8: seconds in a month
            assert result.global_downtime_s <= limit, (label, n, result.global_downtime_s)
            assert result.analytic_global_downtime_s <= max(limit, 1.0)


@pytest.mark.parametrize("label", ["elastic_dp", "checkpoint_dp"])
def test_dp_global_downtime_is_its_downtime(table, label):
    for result in table[label].values():
        assert result.global_downtime_s == pytest.approx(result.downtime_s)
        assert result.global_downtime_s > 0


# ----------------------------------------------------------- assumptions -> constants


def test_default_times_are_derived_from_the_stated_assumptions():
    a = gp.DEFAULT_ASSUMPTIONS
    params = gp.GoodputParams()
    # each derived time, recomputed by hand from its assumptions
    assert params.detect_s == (a.missed_heartbeats - 0.5) * a.heartbeat_interval_s == 10.0
    assert params.dp_rescale_s == a.reconfigure_s == 5.0
    assert params.dp_commit_s == params.learner_commit_s == a.resume_commit_s == 1.0
    assert params.dp_step_s == a.step_s == 2.0
    assert params.learner_snapshot_s == a.snapshot_every_steps * a.step_s == 2.0
    reload_s = a.model_params * a.weight_bytes_per_param / (a.reload_gb_per_s * 1e9)
    assert reload_s == 11.0  # 1.1e12 bf16 weights = 2.2 TB at 200 GB/s
    assert params.learner_restart_s == a.reconfigure_s + reload_s == 16.0
    ckpt_s = a.model_params * a.checkpoint_bytes_per_param / (a.checkpoint_gb_per_s * 1e9)
    assert params.checkpoint_write_s == pytest.approx(ckpt_s) == pytest.approx(13.2)
    assert params.checkpoint_restore_s == pytest.approx(13.2)
    assert params.job_restart_s == a.job_relaunch_s + a.reconfigure_s == 65.0
    assert gp.GoodputParams.from_assumptions() == params


def test_every_assumption_is_documented():
    for f in dataclasses.fields(gp.RecoveryAssumptions):
        doc = f.metadata["doc"]
        assert doc.startswith(("assumption:", "Di-PS", "bf16", "full training state")), f.name
        assert f.name in gp.__doc__, f.name


def test_changing_an_assumption_moves_its_derived_times():
    a = dataclasses.replace(gp.DEFAULT_ASSUMPTIONS, heartbeat_interval_s=2.0, model_params=2.2e12)
    params = gp.GoodputParams.from_assumptions(a, chips=1_200_000)
    assert params.detect_s == 5.0
    assert params.learner_restart_s == 5.0 + 22.0
    assert params.checkpoint_write_s == pytest.approx(26.4)
    assert gp.GoodputParams.from_assumptions(a, detect_s=7.0).detect_s == 7.0  # override


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (dict(heartbeat_interval_s=-1.0), "heartbeat_interval_s"),
        (dict(missed_heartbeats=0), "missed_heartbeats"),
        (dict(missed_heartbeats=2.5), "missed_heartbeats"),
        (dict(snapshot_every_steps=0), "snapshot_every_steps"),
        (dict(reload_gb_per_s=0.0), "reload_gb_per_s"),
        (dict(checkpoint_gb_per_s=math.inf), "checkpoint_gb_per_s"),
        (dict(model_params=math.nan), "model_params"),
    ],
)
def test_invalid_assumptions_raise_naming_the_field(overrides, name):
    with pytest.raises(ValueError, match=f"RecoveryAssumptions.{name}"):
        gp.RecoveryAssumptions(**overrides)


# ---------------------------------------------------------------- checkpoint/restart DP


def test_checkpoint_interval_defaults_to_young_daly():
    params = gp.GoodputParams(chips=1_200_000, method="checkpoint_dp")
    expected = math.sqrt(2 * params.checkpoint_write_s * params.mtbf_cluster_s)
    assert params.checkpoint_interval == pytest.approx(expected)
    assert params.recovery() == (
        params.detect_s + params.job_restart_s,
        params.checkpoint_restore_s + params.dp_commit_s,
        expected,
        params.checkpoint_write_s,
    )
    explicit = dataclasses.replace(params, checkpoint_interval_s=100.0)
    assert explicit.checkpoint_interval == 100.0


@pytest.mark.parametrize("chips", CHIPS)
def test_young_daly_is_near_the_best_interval(chips):
    params = gp.GoodputParams(chips=chips, method="checkpoint_dp")
    young = gp.analytic_goodput(params)
    best = max(
        gp.analytic_goodput(dataclasses.replace(params, checkpoint_interval_s=tau))
        for tau in np.geomspace(1.0, 2_000.0, 400)
    )
    assert best - young <= YOUNG_DALY_POINTS, (chips, young, best)


def test_checkpoint_restart_without_failures_is_one_minus_checkpoint_overhead():
    # tau = 590 s of work then C = 10 s of writing: 144 periods in one day, 590 / 600 useful.
    params = gp.GoodputParams(
        chips=1_000,
        method="checkpoint_dp",
        mtbi_years=1e9,
        checkpoint_interval_s=590.0,
        checkpoint_write_s=10.0,
        horizon_days=1.0,
    )
    result = gp.goodput(params)
    assert result.interruptions == 0
    assert result.percent == pytest.approx(100.0 * 590.0 / 600.0, abs=1e-12)
    assert result.checkpoint_s == pytest.approx(144 * 10.0)
    assert result.analytic_percent == pytest.approx(100.0 * 590.0 / 600.0, abs=1e-6)
    # Young/Daly: rare failures, waste ~ C / tau + tau / (2 MTBF) = sqrt(2 C / MTBF)
    young = dataclasses.replace(params, checkpoint_interval_s=None)
    waste = 1.0 - gp.analytic_goodput(young) / 100.0
    expected = math.sqrt(2 * young.checkpoint_write_s / young.mtbf_cluster_s)
    assert waste == pytest.approx(expected, rel=1e-3)


def test_checkpoint_restart_hand_computed_stream():
    params = gp.GoodputParams(
        chips=1,
        method="checkpoint_dp",
        detect_s=10.0,
        job_restart_s=50.0,  # absorb: [t, t + 60)
        checkpoint_restore_s=20.0,
        dp_commit_s=0.0,  # commit: [t + 60, t + 80)
        checkpoint_interval_s=590.0,
        checkpoint_write_s=10.0,  # period 600 s
        horizon_days=1.0,  # 86 400 s
    )
    times = np.array([1_000.0, 1_030.0, 1_075.0])
    result = gp.simulate_events(params, times, np.zeros(3, dtype=np.int64))
    # 1000: one period done (590 useful, 10 written), 400 s lost; 1030: absorbed;
    # 1075: in the commit window [1060, 1080): recovery restarts, resumes at 1155.
    # Tail 85 245 s = 142 periods + 45 s of work: 142 * 590 + 45 useful, 1420 s written.
    assert (result.recoveries, result.restarts, result.absorbed) == (1, 1, 1)
    assert result.downtime_s == pytest.approx(75.0 + 80.0)
    assert result.lost_work_s == pytest.approx(400.0)
    assert result.checkpoint_s == pytest.approx(10.0 + 1_420.0)
    useful = 590.0 + 142 * 590.0 + 45.0
    assert result.percent == pytest.approx(100.0 * useful / 86_400.0, abs=1e-12)


def test_checkpoint_restart_with_free_checkpoints_is_elastic_dp():
    # No write, no restore, restart as fast as a rescale, a checkpoint every step: the same
    # recovery as elastic DP, so the same accounting on the same interruptions.
    elastic = gp.GoodputParams(chips=600, mtbi_years=0.0003, horizon_days=1.0, seed=5)
    ckpt = dataclasses.replace(
        elastic,
        method="checkpoint_dp",
        checkpoint_write_s=0.0,
        checkpoint_restore_s=0.0,
        job_restart_s=elastic.dp_rescale_s,
        checkpoint_interval_s=elastic.dp_step_s,
    )
    a, b = gp.goodput(elastic), gp.goodput(ckpt)
    assert b.percent == pytest.approx(a.percent, abs=1e-12)
    assert b.analytic_percent == pytest.approx(a.analytic_percent, abs=1e-9)


def test_checkpoint_restart_is_below_elastic_dp_and_collapses_at_scale(table):
    for n in CHIPS:
        ckpt, elastic = table["checkpoint_dp"][n], table["elastic_dp"][n]
        assert ckpt.percent < elastic.percent, (n, ckpt.percent, elastic.percent)
        assert ckpt.analytic_percent < elastic.analytic_percent
    assert table["checkpoint_dp"][1_200_000].percent < 10.0  # vs 59 % elastic
    assert table["checkpoint_dp"][2_400_000].percent < 2.0


def test_checkpoint_restart_closed_form_falls_with_chips():
    values = [
        gp.analytic_goodput(gp.GoodputParams(chips=n, method="checkpoint_dp"))
        for n in (10_000, 50_000, *CHIPS)
    ]
    assert all(a > b for a, b in itertools.pairwise(values)), values


# -------------------------------------------------------------- Monte-Carlo vs analytic


def test_monte_carlo_agrees_with_closed_form(table):
    for label, row in table.items():
        for n, result in row.items():
            gap = abs(result.percent - result.analytic_percent)
            assert gap <= MC_VS_ANALYTIC_POINTS, (label, n, result.percent, result.analytic_percent)


def test_global_downtime_agrees_with_closed_form_when_it_is_large():
    # 3 learners failing every ~10 s each: all-stalled time is frequent enough to measure.
    params = gp.GoodputParams(
        chips=300, method="decoupled", learners=3, mtbi_years=0.0001, horizon_days=5
    )
    result = gp.goodput(params)
    assert result.global_downtime_s > 0.05 * result.horizon_s
    assert result.global_downtime_s == pytest.approx(result.analytic_global_downtime_s, rel=0.1)
    assert abs(result.percent - result.analytic_percent) <= MC_VS_ANALYTIC_POINTS


def test_closed_form_reduces_to_mtbf_over_mtbf_plus_mttr():
    params = gp.GoodputParams(chips=1_200_000, dp_commit_s=0.0, dp_step_s=0.0)
    mtbf, mttr = params.mtbf_cluster_s, params.detect_s + params.dp_rescale_s
    assert gp.analytic_goodput(params) == pytest.approx(100 * mtbf / (mtbf + mttr))


# ------------------------------------------------------- vectorised vs event-by-event


def _reference(params: gp.GoodputParams, times: np.ndarray, domain: np.ndarray):
    """Plain per-event state machine of the documented model (slow, obviously correct)."""
    absorb, commit, work, overhead = params.recovery()
    period = work + overhead
    horizon = params.horizon_s
    sizes = params.domain_sizes()
    productive = 0.0
    stalls: list[list[tuple[float, float]]] = []
    counts = {"recoveries": 0, "restarts": 0, "absorbed": 0}
    for dom, size in enumerate(sizes):
        resume, start, absorb_end, end = 0.0, None, -math.inf, -math.inf
        down = lost = written = 0.0
        intervals: list[tuple[float, float]] = []
        for t in times[domain == dom]:
            if t >= end:  # training: a new recovery, work since the last saved state is lost
                if start is not None:
                    intervals.append((start, min(end, horizon)))
                if period > 0:
                    done, cut = divmod(t - resume, period)
                    lost += cut
                    written += done * overhead
                start, absorb_end, end = t, t + absorb, t + absorb + commit
                counts["recoveries"] += 1
            elif t < absorb_end:
                counts["absorbed"] += 1
            else:  # commit window: recovery restarts from this interruption
                absorb_end, end = t + absorb, t + absorb + commit
                counts["restarts"] += 1
            resume = end
        if start is not None:
            intervals.append((start, min(end, horizon)))
        if period > 0 and resume < horizon:  # trains until the horizon; unfinished work counts
            done, cut = divmod(horizon - resume, period)
            written += done * overhead + max(cut - work, 0.0)
        down = sum(b - a for a, b in intervals)
        productive += size * (horizon - down - lost - written)
        stalls.append(intervals)
    common = stalls[0]
    for other in stalls[1:]:
        common = [
            (max(a, c), min(b, d)) for a, b in common for c, d in other if max(a, c) < min(b, d)
        ]
    return (
        100.0 * productive / (params.chips * horizon),
        sum(b - a for a, b in common),
        counts,
    )


def _check_against_reference(params: gp.GoodputParams) -> None:
    times, domain = gp.draw_events(params)
    result = gp.simulate_events(params, times, domain)
    percent, global_down, counts = _reference(params, times, domain)
    assert result.percent == pytest.approx(percent, abs=1e-9)
    assert result.global_downtime_s == pytest.approx(global_down, abs=1e-6)
    assert (result.recoveries, result.restarts, result.absorbed) == (
        counts["recoveries"],
        counts["restarts"],
        counts["absorbed"],
    )


@pytest.mark.parametrize(
    "overrides",
    [
        dict(method="elastic_dp"),
        dict(method="decoupled", learners=3),
        dict(method="decoupled", learners=7, learner_commit_s=8.0),
        dict(method="elastic_dp", dp_commit_s=0.0, dp_step_s=0.0),
        dict(method="elastic_dp", detect_s=0.0, dp_rescale_s=0.0, dp_commit_s=5.0),
        dict(method="checkpoint_dp"),
        dict(method="checkpoint_dp", checkpoint_interval_s=7.0, checkpoint_write_s=3.0),
        dict(method="checkpoint_dp", job_restart_s=0.0, checkpoint_restore_s=30.0),
    ],
)
def test_vectorised_matches_event_loop(overrides):
    base = gp.GoodputParams(chips=600, mtbi_years=0.0003, horizon_days=1.0, seed=3)
    _check_against_reference(dataclasses.replace(base, **overrides))


@given(
    case=st.fixed_dictionaries(
        {
            "chips": st.integers(1, 400),
            "learners": st.integers(1, 6),
            "mtbi_hours": st.floats(0.5, 50.0),
            "absorb": st.floats(0.0, 60.0),
            "commit": st.floats(0.0, 20.0),
            "step": st.one_of(st.just(0.0), st.floats(1e-3, 10.0)),  # seconds (no subnormals)
            "seed": st.integers(0, 2**31),
        }
    )
)
def test_vectorised_matches_event_loop_property(case):
    params = gp.GoodputParams(
        chips=case["chips"],
        method="decoupled",
        learners=min(case["learners"], case["chips"]),
        mtbi_years=case["mtbi_hours"] * 3600 / gp.SECONDS_PER_YEAR,
        detect_s=0.0,
        learner_restart_s=case["absorb"],
        learner_commit_s=case["commit"],
        learner_snapshot_s=case["step"],
        horizon_days=0.25,
        seed=case["seed"],
    )
    _check_against_reference(params)


@given(
    case=st.fixed_dictionaries(
        {
            "chips": st.integers(1, 400),
            "mtbi_hours": st.floats(0.5, 50.0),
            "absorb": st.floats(0.0, 60.0),
            "commit": st.floats(0.0, 20.0),
            "work": st.floats(0.01, 50.0),
            "write": st.floats(0.0, 20.0),
            "seed": st.integers(0, 2**31),
        }
    )
)
def test_vectorised_matches_event_loop_checkpoint_property(case):
    params = gp.GoodputParams(
        chips=case["chips"],
        method="checkpoint_dp",
        mtbi_years=case["mtbi_hours"] * 3600 / gp.SECONDS_PER_YEAR,
        detect_s=0.0,
        job_restart_s=case["absorb"],
        checkpoint_restore_s=case["commit"],
        dp_commit_s=0.0,
        checkpoint_interval_s=case["work"],
        checkpoint_write_s=case["write"],
        horizon_days=0.25,
        seed=case["seed"],
    )
    _check_against_reference(params)


def test_no_interruptions_means_full_goodput():
    result = gp.goodput(chips=10, mtbi_years=1e6, horizon_days=1)
    assert result.interruptions == 0
    assert result.percent == 100.0
    assert result.global_downtime_s == 0.0


# ---------------------------------------------------------------- params and determinism


def test_same_seed_same_result_and_seed_matters():
    a = gp.goodput(chips=300_000, method="decoupled", learners=8, seed=7)
    b = gp.goodput(chips=300_000, method="decoupled", learners=8, seed=7)
    c = gp.goodput(chips=300_000, method="decoupled", learners=8, seed=8)
    assert a == b
    assert a.percent != c.percent


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(chips=0), "chips"),
        (dict(chips=1.5), "chips"),
        (dict(chips=True), "chips"),
        (dict(method="dp"), "method"),
        (dict(learners=8), "learners"),  # elastic DP is one job
        (dict(method="checkpoint_dp", learners=2), "learners"),
        (dict(method="decoupled", learners=0), "learners"),
        (dict(method="decoupled", learners=11, chips=10), "learners"),
        (dict(mtbi_years=0.0), "mtbi_years"),
        (dict(mtbi_years=math.inf), "mtbi_years"),
        (dict(detect_s=-1.0), "detect_s"),
        (dict(dp_rescale_s=math.nan), "dp_rescale_s"),
        (dict(learner_restart_s="16"), "learner_restart_s"),
        (dict(learner_commit_s=-0.5), "learner_commit_s"),
        (dict(learner_snapshot_s=math.inf), "learner_snapshot_s"),
        (dict(checkpoint_write_s=-1.0), "checkpoint_write_s"),
        (dict(checkpoint_restore_s=math.nan), "checkpoint_restore_s"),
        (dict(job_restart_s=math.inf), "job_restart_s"),
        (dict(checkpoint_interval_s=0.0), "checkpoint_interval_s"),
        (dict(checkpoint_interval_s=math.inf), "checkpoint_interval_s"),
        (dict(horizon_days=0), "horizon_days"),
        (dict(seed=-1), "seed"),
        (dict(chips=10**9, horizon_days=365), "chips/horizon_days"),
    ],
)
def test_invalid_params_raise_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"GoodputParams.{field}"):
        gp.GoodputParams(**overrides)


def test_method_labels_round_trip_and_reject_unknown():
    assert gp.parse_method(gp.method_label("decoupled", 16)) == ("decoupled", 16)
    assert gp.parse_method("elastic_dp") == ("elastic_dp", 1)
    assert gp.parse_method("checkpoint_dp") == ("checkpoint_dp", 1)
    assert gp.method_label("checkpoint_dp") == "checkpoint_dp"
    for bad in ("decoupled", "decoupled_m0", "dp", "decoupled_m-1"):
        with pytest.raises(ValueError, match="unknown method"):
            gp.parse_method(bad)


def test_sweep_shape_and_analytic_option():
    out = gp.sweep([150_000, 1_200_000], ["elastic_dp", "decoupled_m8"], horizon_days=2)
    assert set(out) == {"elastic_dp", "decoupled_m8"}
    assert all(set(row) == {150_000, 1_200_000} for row in out.values())
    exact = gp.sweep([1_200_000], ["elastic_dp"], use_analytic=True)
    assert exact["elastic_dp"][1_200_000] == pytest.approx(
        gp.analytic_goodput(gp.GoodputParams(chips=1_200_000))
    )


# ------------------------------------------------------------------------------- CLI


def test_parse_and_format_counts():
    assert [gp.parse_count(s) for s in ("150k", "1.2M", "2_400_000", "64")] == [
        150_000,
        1_200_000,
        2_400_000,
        64,
    ]
    assert [gp.format_count(n) for n in (150_000, 1_200_000, 2_400_000, 1234)] == [
        "150k",
        "1.2M",
        "2.4M",
        "1234",
    ]


def test_cli_json_is_method_chips_percent(capsys):
    argv = ["--chips", "150k", "1.2M", "--learners", "8", "16", "--days", "3", "--json"]
    assert gp.main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"checkpoint_dp", "elastic_dp", "decoupled_m8", "decoupled_m16"}
    expected = gp.sweep([150_000, 1_200_000], list(payload), horizon_days=3)
    for label, row in payload.items():
        assert set(row) == {"150000", "1200000"}
        for chips, percent in row.items():
            assert isinstance(percent, float) and 0.0 < percent <= 100.0
            assert percent == pytest.approx(expected[label][int(chips)], abs=1e-3)


def test_cli_table_and_analytic(capsys):
    assert gp.main(["--chips", "1.2M", "--days", "2"]) == 0
    text = capsys.readouterr().out
    assert "MTBF_cluster" in text and "1.2M" in text and "decoupled_m16" in text
    assert "checkpoint_dp" in text and "Young/Daly" in text
    assert gp.main(["--chips", "1.2M", "--analytic", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["elastic_dp"]["1200000"] == pytest.approx(
        gp.analytic_goodput(gp.GoodputParams(chips=1_200_000)), abs=1e-3
    )


def test_cli_bad_value_exits_with_named_field(capsys):
    with pytest.raises(SystemExit) as info:
        gp.main(["--chips", "1.2M", "--dp-rescale-s", "-3"])
    assert info.value.code == 2
    assert "GoodputParams.dp_rescale_s" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gp.main(["--chips", "lots"])


def test_cli_assumption_flags_feed_the_derived_times(capsys):
    argv = ["--chips", "1.2M", "--analytic", "--json", "--heartbeat-interval-s", "2"]
    assert gp.main([*argv, "--checkpoint-interval-s", "100"]) == 0
    payload = json.loads(capsys.readouterr().out)
    base = gp.GoodputParams(chips=1_200_000, detect_s=5.0)  # (3 - 1/2) beats of 2 s
    assert payload["elastic_dp"]["1200000"] == pytest.approx(gp.analytic_goodput(base), abs=1e-3)
    ckpt = dataclasses.replace(base, method="checkpoint_dp", checkpoint_interval_s=100.0)
    assert payload["checkpoint_dp"]["1200000"] == pytest.approx(gp.analytic_goodput(ckpt), abs=1e-3)
    with pytest.raises(SystemExit) as info:
        gp.main(["--chips", "1.2M", "--missed-heartbeats", "0"])
    assert info.value.code == 2
    assert "RecoveryAssumptions.missed_heartbeats" in capsys.readouterr().err
