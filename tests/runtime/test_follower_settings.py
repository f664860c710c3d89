"""The run config's follower settings reach the follower process: its data plane's limits
(``RunSpec.dataplane_*``) and its core's options (``SimConfig.refuse_nonfinite``)."""

import dataclasses
import inspect

import pytest

from dipsjax.launch import config as run_config
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig
from dipsjax.transport.dataplane import DataPlaneServer

SETTINGS = [
    "dataplane_max_connections=40",
    "dataplane_max_per_address=3",
    "dataplane_first_frame_timeout=2.5",
    "dataplane_idle_timeout=7.0",
    "sim.refuse_nonfinite=True",
]


def test_runspecs_defaults_are_the_data_planes():
    server = inspect.signature(DataPlaneServer).parameters
    spec = RunSpec(SimConfig(), "", (), "", "runs/x", (), 0)
    for name, value in spec.dataplane_limits().items():
        assert value == server[name].default, name


def _spec(tmp_path, overrides):
    from dipsjax.runtime.client import model_shapes
    from dipsjax.runtime.credentials import create

    cfg = run_config.load("quickstart", "ci", overrides)
    sim = run_config.sim_config(cfg)
    probe = RunSpec(sim, "", (), "", str(tmp_path), (), 0)
    layers = len(model_shapes(probe))
    return RunSpec(
        sim,
        "127.0.0.1:1",  # no leader: the node is built, not started
        ("127.0.0.1:1",),  # served on a free port instead (port=0)
        create(tmp_path / "credentials").directory,
        str(tmp_path),
        (0,) * layers,
        1,
        tls=False,
        checkpoints=False,
        **run_config.spec_settings(cfg),
    )


@pytest.mark.parametrize("overrides", [[], SETTINGS])
def test_the_configs_follower_settings_reach_its_data_plane_and_its_core(tmp_path, overrides):
    from dipsjax.runtime.follower import FollowerNode

    spec = _spec(tmp_path, overrides)
    node = FollowerNode(spec, 0, init="zeros", port=0)
    try:
        d = node.data
        got = (d.max_connections, d.max_per_address, d.first_frame_timeout, d.idle_timeout)
        nonfinite = node.follower.refuse_nonfinite
    finally:
        node.data.close()
        node.tb.close()
    if overrides:
        assert got == (40, 3, 2.5, 7.0) and nonfinite is True
    else:
        assert got == (256, 64, 5.0, 60.0) and nonfinite is False


def test_the_spec_keeps_them_through_spec_json(tmp_path):
    spec = dataclasses.replace(
        RunSpec(SimConfig(refuse_nonfinite=True), "", (), "", str(tmp_path), (), 0),
        dataplane_max_connections=9,
        dataplane_max_per_address=9,
        dataplane_idle_timeout=0.5,
    )
    spec.write(tmp_path / "spec.json")
    again = RunSpec.read(tmp_path / "spec.json")
    assert again == spec and again.sim.refuse_nonfinite


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (dict(dataplane_max_connections=0), "dataplane_max_connections"),
        (dict(dataplane_max_connections=True), "dataplane_max_connections"),
        (dict(dataplane_max_per_address=257), "dataplane_max_per_address"),  # > 256
        (dict(dataplane_max_connections=8), "dataplane_max_per_address"),  # 64 > 8
        (dict(dataplane_first_frame_timeout=0.0), "dataplane_first_frame_timeout"),
        (dict(dataplane_idle_timeout=float("inf")), "dataplane_idle_timeout"),
    ],
)
def test_runspec_refuses_limits_the_data_plane_would(fields, named):
    with pytest.raises(ValueError, match=f"RunSpec.{named} must be"):
        RunSpec(SimConfig(), "", (), "", "runs/x", (), 0, **fields)


def test_runspec_refuses_a_learner_speed_the_processes_cannot_emulate():
    """A learner process is slowed by sleeping ``speed - 1`` times its step time: a speed
    below 1 (which the simulator takes) made that sleep negative, a ValueError mid-round."""
    with pytest.raises(ValueError, match=r"RunSpec.sim.speeds must be >= 1 each"):
        RunSpec(SimConfig(learners=2, speeds=(0.5, 1.0)), "", (), "", "runs/x", (), 0)
    RunSpec(SimConfig(learners=2, speeds=(1.0, 2.0)), "", (), "", "runs/x", (), 0)
