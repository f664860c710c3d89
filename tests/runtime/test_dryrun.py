"""``dipsjax run CONFIG --dry-run``: the plan of a job, for any model size, without
hardware; each figure checked against an independent count."""

import math

import numpy as np
import pytest

from dipsjax.launch import run as run_cmd
from dipsjax.model.configs import get_config
from dipsjax.model.plan import memory_plan
from dipsjax.runtime.client import model_layout
from dipsjax.runtime.dryrun import plan
from dipsjax.sim.config import WIRE_BYTES, SimConfig
from dipsjax.sim.experiments import load_experiment


@pytest.mark.parametrize("wire", ["bf16", "int8"])
def test_the_plan_of_a_small_job_matches_what_the_runtime_builds(tmp_path, wire):
    sim = SimConfig(learners=3, followers=2, wire=wire)
    spec = run_cmd.make_spec(sim, tmp_path / "run")
    _, params = model_layout(spec)  # the real parameters, allocated
    from dipsjax import outer

    sizes = [int(np.size(x)) for x in outer.flatten(params).values()]
    p = plan(sim)
    assert p["params"] == sum(sizes) and p["tensors"] == len(sizes)
    assert tuple(p["layer_owner"]) == spec.layer_owner  # the shards the runtime uses
    followers = p["roles"]["followers"]
    assert sum(f["params"] for f in followers) == sum(sizes)
    per_value = {"bf16": lambda s: 2 * s, "int8": lambda s: s + 4 * math.ceil(s / 64)}[wire]
    assert p["roles"]["learner"]["push_bytes"] == sum(per_value(s) for s in sizes)
    for f in followers:
        mine = [s for s, k in zip(sizes, spec.layer_owner, strict=True) if k == f["follower"]]
        assert f["in_bytes_per_round"] == 3 * sum(per_value(s) for s in mine)
        assert f["out_bytes_per_pull"] == 4 * sum(mine)


def test_paper_scale_configs_plan_without_hardware_and_place_the_server_by_b_times_p(capsys):
    assert run_cmd.main(["dipsjax/configs/paper_100b.py", "--dry-run"]) == 0  # by its path
    out = capsys.readouterr().out
    n = memory_plan(get_config("dips-100b")).num_params
    assert f"{n:,} parameters" in out and "16 learners, 16 followers" in out
    cfg = load_experiment("paper_100b")  # a shipped config's name
    b = np.asarray(cfg.placement.bandwidth_gbps)
    speeds = np.asarray(cfg.sim.speeds)
    best = int(np.argmax(b @ (1.0 / speeds)))
    fastest_link = int(np.unravel_index(np.argmax(b), b.shape)[0])
    assert best != fastest_link  # the config is built so that the two differ
    assert f"parameter server at {cfg.placement.sites[best]}" in out
    # A partition's push: its bytes over its link to that site (one tensor a step).
    p = plan(SimConfig(**{**cfg.sim, "speeds": tuple(cfg.sim.speeds)}), cfg.placement.to_dict())
    push = p["roles"]["learner"]["push_bytes"]
    for j, s in enumerate(p["placement"]["push_seconds"]):
        assert s == pytest.approx(push / (b[best, j] * 1e9 / 8), rel=1e-9)
    for name in ("paper_1b", "paper_14b"):
        assert run_cmd.main([name, "--dry-run"]) == 0
    # One memory model: the dry run's learner is dipsjax plan's learner_peak, and a
    # follower's the FP32 shard + outer state, its older versions and a round's pushes.
    assert (
        p["roles"]["learner"]["memory_bytes"]
        == memory_plan(get_config("dips-100b")).learner_peak_bytes
    )
    shard = p["roles"]["followers"][0]["params"]
    sim = SimConfig(**{**cfg.sim, "speeds": tuple(cfg.sim.speeds)})
    staged = sim.learners * int(WIRE_BYTES[sim.wire] * shard)
    want = 8 * shard + 4 * shard * (sim.version_cache - 1) + staged
    assert p["roles"]["followers"][0]["memory_bytes"] == want


def test_a_placement_of_the_wrong_shape_is_named(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import ml_collections\n"
        "def get_config(arg=None):\n"
        "    cfg = ml_collections.ConfigDict()\n"
        "    cfg.name = 'bad'\n"
        "    cfg.sim = dict(learners=2, followers=1)\n"
        "    cfg.placement = dict(sites=('a', 'b'), bandwidth_gbps=[[1.0, 2.0, 3.0]] * 2)\n"
        "    return cfg\n"
    )
    assert run_cmd.main([str(bad), "--dry-run"]) == 2  # refused by the config's validation
    assert "placement.bandwidth_gbps: must be [2 sites][2 learners]" in capsys.readouterr().err
