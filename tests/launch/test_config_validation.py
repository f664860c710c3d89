"""A run's config is validated whole, up front: every field has a rule (type, range or
allowed set) and the cross-field rules hold, or ``dipsjax run`` refuses it with the field
named, exit code 2, no traceback, and nothing written (issue 18, item 8)."""

import copy
import dataclasses
import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dipsjax import configs
from dipsjax.launch import config as run_config

# The issue's examples: each was accepted up front (or ended in a traceback after
# credentials/ was written). (override, field the error must name).
ISSUE_EXAMPLES = [
    ("sim.batch_size=0", "sim.batch_size"),
    ("sim.outer_lr=-1.0", "sim.outer_lr"),
    ("heartbeat_interval=1e999", "heartbeat_interval"),
    ("sim.speeds=(1e999, 1.0, 1.0, 1.0)", "sim.speeds"),
    ("sim.learners=5000", "sim.learners"),
    ("sim.method='dp'", "sim.method"),
    ("name='../../escaped'", "name"),
    ("name='a/b'", "name"),
    ("name='.hidden'", "name"),
    ("name=''", "name"),
    ("name='" + "x" * 300 + "'", "name"),
    ("sim.corpus='/nonexistent'", "sim.corpus"),
    ("sim.seed=-1", "sim.seed"),
    ("sim.seed=" + str(2**64), "sim.seed"),
    ("sim.heartbeat_interval=nan", "sim.heartbeat_interval"),
]


@pytest.mark.parametrize(("override", "field"), ISSUE_EXAMPLES)
def test_the_issues_nonsense_values_are_refused_up_front_with_the_field_named(override, field):
    if override.endswith("=nan"):
        cfg = run_config.load("quickstart", "ci")
        cfg.sim.heartbeat_interval = math.nan
    else:
        cfg = run_config.load("quickstart", "ci", [override])
    with pytest.raises(ValueError) as info:
        run_config.sim_config(cfg)
    message = str(info.value)
    assert f"config {field}: must be " in message, message
    assert "got " in message


# The followers' data-plane limits (run-level: RunSpec fields, not SimConfig's).
DATAPLANE_EXAMPLES = [
    ("dataplane_max_connections=0", "dataplane_max_connections"),
    ("dataplane_max_connections=1000000", "dataplane_max_connections"),
    ("dataplane_max_connections=True", "dataplane_max_connections"),
    ("dataplane_max_per_address=2.0", "dataplane_max_per_address"),
    ("dataplane_max_per_address=-1", "dataplane_max_per_address"),
    ("dataplane_max_per_address=300", "dataplane_max_per_address"),  # > 256, the default
    ("dataplane_max_connections=32", "dataplane_max_per_address"),  # 64, the default, > 32
    ("dataplane_first_frame_timeout=0.0", "dataplane_first_frame_timeout"),
    ("dataplane_first_frame_timeout=1e999", "dataplane_first_frame_timeout"),
    ("dataplane_idle_timeout=-5.0", "dataplane_idle_timeout"),
    ("dataplane_idle_timeout='60'", "dataplane_idle_timeout"),
    ("sim.refuse_nonfinite=1", "sim.refuse_nonfinite"),
    ("peer_rpc_cap=-1", "peer_rpc_cap"),
    ("peer_rpc_cap=True", "peer_rpc_cap"),
]


@pytest.mark.parametrize(("override", "field"), DATAPLANE_EXAMPLES)
def test_bad_follower_settings_are_refused_with_the_field_named(override, field):
    cfg = run_config.load("quickstart", "ci", [override])
    with pytest.raises(ValueError) as info:
        run_config.sim_config(cfg)
    assert f"config {field}: must be " in str(info.value), str(info.value)


def test_the_per_address_cap_is_checked_against_the_connection_cap():
    cfg = run_config.load("quickstart", "ci", ["dataplane_max_connections=32"])
    with pytest.raises(ValueError) as info:
        run_config.sim_config(cfg)
    assert str(info.value) == (
        "config dataplane_max_per_address: must be at most dataplane_max_connections (32), got 64"
    )
    ok = ["dataplane_max_connections=32", "dataplane_max_per_address=32"]
    run_config.sim_config(run_config.load("quickstart", "ci", ok))
    cfg = run_config.load("quickstart", "ci", [*ok, "dataplane_idle_timeout=5"])
    assert run_config.spec_settings(cfg) == {
        "heartbeat_interval": 2.0,
        "dataplane_max_connections": 32,
        "dataplane_max_per_address": 32,
        "dataplane_idle_timeout": 5,
    }


def _run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dipsjax.cli", "run", "quickstart", "--arg", "ci", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _refused_up_front(tmp_path, override):
    """``dipsjax run --set OVERRIDE``'s one line of error: exit 2, no traceback, and no run
    folder (no credentials/) written."""
    out = tmp_path / "run"
    proc = _run_cli(tmp_path, "--out", str(out), "--set", override)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert not out.exists()  # no run folder, no credentials/
    return lines[0]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("sim.corpus='/nonexistent'", "sim.corpus"),
        ("sim.seed=-1", "sim.seed"),
        ("sim.batch_size=0", "sim.batch_size"),
        ("sim.validation_doc='nope'", "sim.validation_doc"),  # credentials/ was written
        # Issue 19: a method the simulator has but the runtime's syncer not (its leader
        # would crash-loop on it, burying the error): refused, the allowed ones named.
        ("sim.method='dp'", "sim.method"),
        ("sim.method='async_diloco'", "sim.method"),
    ],
)
def test_dipsjax_run_refuses_a_bad_value_with_one_line_exit_2_and_writes_nothing(
    tmp_path, override, field
):
    line = _refused_up_front(tmp_path, override)
    assert f"config {field}: must be " in line
    if field == "sim.method":
        from dipsjax.syncer.methods import METHODS

        assert all(repr(name) in line for name in METHODS) and "for `dipsjax run`" in line
    assert list(tmp_path.iterdir()) == []


# The rules between launch and sim that role_jobs checks: each was found only after
# make_spec had written the run folder and credentials/ (quickstart ci: 4 learners, batch 8).
PARTITION_EXAMPLES = [
    (["launch.learner.cpu_devices=3"], "launch.learner.cpu_devices"),
    (["launch.learner.processes=3"], "launch.learner.processes"),
    (["launch.learner.cpu_devices=16"], "launch.learner.cpu_devices"),
    (["launch.learners={5: {'cpus': 1}}"], "launch.learners.5"),
    (["launch.learners={'1': {'cpu_devices': 3}}"], "launch.learners.1.cpu_devices"),
    (
        ["launch.learner.cpu_devices=2", "launch.learners={'2': {'processes': 3}}"],
        "launch.learners.2.processes",
    ),
    (["launch.learners={'0': {'platform': 'gpu'}}"], "launch.learners.0.accelerators"),
    (
        ["launch.learner.platform='gpu'", "launch.learner.accelerators=()"],
        "launch.learner.accelerators",
    ),
    (
        ["launch.learner.platform='gpu'", "launch.learner.accelerators=(0, 1, 2)"],
        "launch.learner.accelerators",
    ),
    (  # divides the batch, but a TPU host does not split into 3 chips
        [
            "launch.learners={'1': {'platform': 'tpu', 'accelerators': (0, 1, 2)}}",
            "sim.batch_size=24",
        ],
        "launch.learners.1.accelerators",
    ),
    # A mesh that does not fit the partition, and one whose batch devices (data x fsdp)
    # do not divide the batch (8 devices, tensor 2: 4 batch devices; batch 6).
    (
        ["launch.learner.cpu_devices=4", "launch.learner.mesh_tensor=3"],
        "launch.learner.mesh_tensor",
    ),
    (
        ["launch.learner.cpu_devices=2", "launch.learners={'1': {'mesh_data': 4}}"],
        "launch.learners.1.mesh_data",
    ),
    (
        ["launch.learner.cpu_devices=8", "launch.learner.mesh_tensor=2", "sim.batch_size=6"],
        "launch.learner.mesh_tensor",
    ),
]


@pytest.mark.parametrize(("overrides", "field"), PARTITION_EXAMPLES)
def test_partitions_that_cannot_split_the_batch_or_name_no_learner_are_refused(overrides, field):
    cfg = run_config.load("quickstart", "ci", overrides)
    with pytest.raises(ValueError) as info:
        run_config.sim_config(cfg)
    assert str(info.value).startswith(f"config {field}: must be "), str(info.value)


def test_partitions_that_split_the_batch_are_accepted_and_build_their_jobs():
    from dipsjax.launch.core import requirements_from_config, role_jobs
    from dipsjax.runtime.spec import RunSpec

    for overrides in [
        ["launch.learner.cpu_devices=2", "launch.learner.processes=2"],
        ["launch.learners={3: {'cpu_devices': 8}}"],
        ["launch.learner.platform='gpu'", "launch.learner.accelerators=(0, 1)"],
        ["launch.learner.cpu_devices=4", "launch.learners={'0': {'cpu_devices': 1}}"],
        # 2 x 2 x 2 over 8 devices: the batch (8) is split over data x fsdp = 4 only.
        [
            "launch.learner.cpu_devices=8",
            "launch.learner.mesh_data=2",
            "launch.learner.mesh_tensor=2",
        ],
        # tensor over all 16 devices of a partition: a batch of 8 on 1 batch device.
        ["launch.learner.cpu_devices=16", "launch.learner.mesh_tensor=16"],
    ]:
        cfg = run_config.load("quickstart", "ci", overrides)
        sim = run_config.sim_config(cfg)
        spec = RunSpec(sim, "", (), "", "runs/x", (), 0)
        assert len(role_jobs(spec, **requirements_from_config(cfg))) == 1 + sim.learners


@pytest.mark.parametrize(
    "override", ["launch.learner.cpu_devices=3", "launch.learners={5: {'cpus': 1}}"]
)
def test_dipsjax_run_refuses_a_bad_partition_before_writing_anything(tmp_path, override):
    line = _refused_up_front(tmp_path, override)
    assert "config launch.learner" in line and ": must be " in line, line
    assert list(tmp_path.iterdir()) == []


def test_make_spec_checks_its_settings_before_writing_anything(tmp_path):
    from dipsjax.launch.run import make_spec

    sim = run_config.sim_config(run_config.load("quickstart", "ci"))
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="max_restarts"):
        make_spec(sim, out, max_restarts=-1)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


# ---- every field, hostile values: refused with the field named, or the run can start ----

from dipsjax.launch import schema  # noqa: E402
from dipsjax.launch.schema import ConfigError  # noqa: E402

REQ = tuple(schema.REQUIREMENTS)
FIELDS = sorted(
    [f"sim.{k}" for k in schema.SIM]
    + list(schema.TOP)
    + [f"launch.{role}.{k}" for role in ("learner", "follower", "leader") for k in REQ]
    # a partition's own requirements (learner 1 of 4) and one that names no learner (9)
    + [f"launch.learners.1.{k}" for k in REQ]
    + ["launch.learners.9.cpus"]
    + [f"launch.slurm.{k}" for k in schema.SLURM]
    + [f"launch.kubernetes.{k}" for k in schema.KUBERNETES]
)
HOSTILE = [
    0,
    1,
    -1,
    2,
    3,
    4,
    5000,
    -(2**63),
    2**30,
    2**32,
    2**64,
    10**30,
    0.0,
    -0.0,
    -1.0,
    0.5,
    1.0,
    1e-320,
    1e308,
    math.inf,
    -math.inf,
    math.nan,
    True,
    False,
    None,
    "",
    "x",
    "dips",
    "dp",
    "../x",
    "/",
    "..",
    ".hidden",
    "a/b",
    "a" * 300,
    "\x00",
    "a\nb",
    "/nonexistent",
    "persuasion",
    "emma",
    "austen",
    "tiny",
    "fp32",
    "gpu",
    (),
    (1.0,),
    (math.inf, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0),
    ((0, 1.0, 2.0),),
    ((9, 1.0),),
    ((0, 2.0, 1.0),),
    [],
    {},
    {"x": 1},
]
VALUES = st.one_of(
    st.sampled_from(HOSTILE),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.floats(min_value=-10, max_value=10), max_size=5).map(tuple),
)


def _set(cfg: dict, path: str, value) -> None:
    keys = path.split(".")
    node = cfg
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value


@functools.lru_cache(maxsize=64)
def _chunks(corpus: str, chunk_len: int, validation_doc: str | None) -> int:
    from dipsjax.data import ByteTokenizer, train_chunks

    tokens = train_chunks(
        corpus, chunk_len=chunk_len, tokenizer=ByteTokenizer(), validation_doc=validation_doc
    )
    return tokens.shape[0]


def _usable(cfg: dict, sim) -> None:
    """What a run builds from its config before it writes anything: none of it may raise."""
    import numpy as np

    from dipsjax.data.ledger import new_ledger
    from dipsjax.launch.cli import executor_settings
    from dipsjax.launch.core import requirements_from_config, role_jobs
    from dipsjax.launch.kubernetes import Kubernetes
    from dipsjax.launch.slurm import Slurm
    from dipsjax.model.configs import get_config
    from dipsjax.runtime.spec import RunSpec
    from dipsjax.syncer import methods as methods_lib

    methods_lib.build(sim.method, sim.method_settings())
    get_config(sim.model)
    requirements = requirements_from_config(cfg)
    Slurm(**executor_settings(cfg, "slurm", Slurm))
    Kubernetes(**executor_settings(cfg, "kubernetes", Kubernetes))
    settings = run_config.spec_settings(cfg)
    standby = settings.pop("standby_leader", False)  # make_spec gives it an address
    spec = RunSpec(sim, "", (), "", "runs/x", (), 0, **settings)
    jobs = role_jobs(spec, **requirements)  # what the run adds once make_spec has written
    assert len(jobs.jobs) == 1 + sim.learners
    if standby:
        with_standby = dataclasses.replace(
            spec, leader="127.0.0.1:1", standby="127.0.0.1:2", followers=("127.0.0.1:3",)
        )
        assert "standby" in [j.name for j in role_jobs(with_standby, **requirements)]
    for job in jobs:
        job.requirements.env()
    limits = spec.dataplane_limits()  # what the followers' DataPlaneServer is given
    assert 1 <= limits["max_per_address"] <= limits["max_connections"]
    chunks = _chunks(sim.corpus, sim.chunk_len, sim.validation_doc)  # what make_spec reads
    new_ledger(int(chunks), batches_per_chunk=sim.batches_per_chunk, seed=sim.seed)
    np.random.default_rng(sim.seed)
    runs = Path.cwd() / "runs"  # where dipsjax run puts NAME-TIME
    assert (runs / f"{cfg['name']}-20260101-000000").resolve().parent == runs


BASE = run_config.load("quickstart", "ci").to_dict()


def _check(field: str, value) -> str:
    """``field = value`` in the quickstart config: refused with the field named, or usable."""
    cfg = copy.deepcopy(BASE)
    _set(cfg, field, value)
    try:
        sim = schema.validate(cfg)
    except ConfigError as e:
        # The field itself, or a cross-field rule that names it (speeds: len == sim.learners),
        # or the block holding it (launch.learners.9: no such learner).
        named = e.field == field or field in e.allowed or field.startswith(f"{e.field}.")
        assert named, (field, value, str(e))
        assert str(e).startswith(f"config {e.field}: must be ")
        return "refused"
    _usable(cfg, sim)
    return "accepted"


@settings(derandomize=True, max_examples=400, deadline=None)
@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_fuzz_every_field_is_refused_with_its_name_or_the_run_can_start(field, value):
    event(_check(field, value))


def test_every_field_against_every_hostile_value():
    for field in FIELDS:
        outcomes = [_check(field, value) for value in HOSTILE]
        # Each field's rule bites: nan, None, '' or a wrong type is refused for every one.
        assert outcomes.count("refused") >= len(HOSTILE) // 2, field
        refused = {repr(v) for v, o in zip(HOSTILE, outcomes, strict=True) if o == "refused"}
        # sim.task_args is the one field that takes a dict (the task's keyword arguments).
        must = {"nan", "inf"} | (set() if field == "sim.task_args" else {"{}"})
        assert must <= refused, field


def test_every_field_has_a_rule():
    import dataclasses

    from dipsjax.launch.core import Requirements
    from dipsjax.launch.kubernetes import Kubernetes
    from dipsjax.launch.slurm import Slurm
    from dipsjax.runtime.spec import RunSpec
    from dipsjax.sim.config import SimConfig

    for cls, table in [
        (SimConfig, schema.SIM),
        (Requirements, schema.REQUIREMENTS),
        (Slurm, schema.SLURM),
        (Kubernetes, schema.KUBERNETES),
    ]:
        assert {f.name for f in dataclasses.fields(cls)} == set(table), cls
    # The run-level fields: each a RunSpec field with a rule, and one --set accepts.
    assert set(schema.TOP) == {"name", *run_config.SPEC_FIELDS}
    # (standby_leader, a switch, becomes RunSpec.standby: the standby's address)
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    assert set(run_config.SPEC_FIELDS) - {"standby_leader"} <= fields and "standby" in fields
    assert set(run_config.SPEC_FIELDS) <= run_config.TOP


# ---- every config shipped validates ---------------------------------------------------

RUN_CONFIGS = ["quickstart", "paper_1b", "paper_14b", "paper_100b"]
SIM_CONFIGS = configs.names("sim_")


@pytest.mark.parametrize("arg", [None, "ci"])
def test_every_shipped_config_validates(arg):
    for name in RUN_CONFIGS:
        cfg = run_config.load(name, arg)
        run_config.sim_config(cfg, plan_only=name.startswith("paper"))
    from dipsjax.sim import experiments

    assert len(SIM_CONFIGS) >= 9
    for name in SIM_CONFIGS:
        assert experiments.expand(experiments.load_experiment(name, arg))
    # The README's examples, the launch script's methods and the simulator's defaults.
    readme = ["sim.learners=2", "sim.speeds=(1.0, 2.0)", "launch.learner.cpu_devices=2"]
    run_config.sim_config(run_config.load("quickstart", arg, readme))
    for method in ("dips", "decoupled", "sync_diloco", "naive_async"):
        run_config.sim_config(run_config.load("quickstart", arg), method)
    import dataclasses

    from dipsjax.sim.config import SimConfig

    schema.validate_sim(dataclasses.asdict(SimConfig()), "simulate")


def test_a_bad_sim_experiment_names_the_run_and_the_field():
    from dipsjax.sim import experiments

    cfg = experiments.load_experiment("sim_eta", "ci")
    cfg.runs[1]["seed"] = -1
    with pytest.raises(ConfigError, match=r"run .*: config runs\[1\]\.seed: must be an integer"):
        experiments.expand(cfg)
    cfg = experiments.load_experiment("sim_eta", "ci")
    cfg.name = "../out"
    with pytest.raises(ConfigError, match="config name: must be a safe path component"):
        experiments.expand(cfg)
