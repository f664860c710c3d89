"""Goodput model: paper anchors, monotonicity, Monte-Carlo vs closed form vs a plain loop."""

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
        dp, m8, m16 = (table[label][n].percent for label in gp.DEFAULT_METHODS)
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


def test_elastic_dp_global_downtime_is_its_downtime(table):
    for result in table["elastic_dp"].values():
        assert result.global_downtime_s == pytest.approx(result.downtime_s)
        assert result.global_downtime_s > 0


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
    absorb, commit, step = params.recovery()
    horizon = params.horizon_s
    sizes = params.domain_sizes()
    productive = 0.0
    stalls: list[list[tuple[float, float]]] = []
    counts = {"recoveries": 0, "restarts": 0, "absorbed": 0}
    for dom, size in enumerate(sizes):
        resume, start, absorb_end, end = 0.0, None, -math.inf, -math.inf
        down = lost = 0.0
        intervals: list[tuple[float, float]] = []
        for t in times[domain == dom]:
            if t >= end:  # training: a new recovery, in-flight work is lost
                if start is not None:
                    intervals.append((start, min(end, horizon)))
                lost += math.fmod(t - resume, step) if step > 0 else 0.0
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
        down = sum(b - a for a, b in intervals)
        productive += size * (horizon - down - lost)
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
            "step": st.floats(0.0, 10.0),
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
        (dict(method="decoupled", learners=0), "learners"),
        (dict(method="decoupled", learners=11, chips=10), "learners"),
        (dict(mtbi_years=0.0), "mtbi_years"),
        (dict(mtbi_years=math.inf), "mtbi_years"),
        (dict(detect_s=-1.0), "detect_s"),
        (dict(dp_rescale_s=math.nan), "dp_rescale_s"),
        (dict(learner_restart_s="16"), "learner_restart_s"),
        (dict(learner_commit_s=-0.5), "learner_commit_s"),
        (dict(learner_snapshot_s=math.inf), "learner_snapshot_s"),
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
    assert set(payload) == {"elastic_dp", "decoupled_m8", "decoupled_m16"}
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
