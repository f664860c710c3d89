"""Partition meshes over device lists and the shardings derived from annotations."""

import jax
import pytest
from jax.sharding import AxisType, PartitionSpec

from dipsjax.learner import make_partition_mesh, shardings_for, split_devices
from dipsjax.learner.mesh import fit_spec, mesh_shape
from dipsjax.learner.step import InnerStep
from dipsjax.model import get_config


def test_mesh_over_given_devices():
    devices = jax.devices()[4:8]
    mesh = make_partition_mesh(devices, tensor=2)
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    assert {d.id for d in mesh.devices.flat} == {d.id for d in devices}
    assert mesh.axis_types == (AxisType.Auto,) * 3
    # Row-major: neighbours along tensor are consecutive devices.
    assert [d.id for d in mesh.devices[0, 0]] == [d.id for d in devices[:2]]


def test_default_mesh_is_all_local_devices_fsdp():
    mesh = make_partition_mesh()
    assert dict(mesh.shape) == {"data": 1, "fsdp": len(jax.local_devices()), "tensor": 1}
    assert mesh_shape(8, data=2, tensor=2) == (2, 2, 2)


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"tensor": 3}, "data x tensor"),
        ({"data": 3}, "data x tensor"),
        ({"data": 0}, "data must be"),
        ({"fsdp": 3}, "data x fsdp x tensor"),
        ({"data": 2, "fsdp": 1, "tensor": 1}, "must equal"),
    ],
)
def test_bad_shapes_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        make_partition_mesh(jax.devices()[:4], **kwargs)


def test_split_devices_is_disjoint():
    groups = split_devices(jax.devices(), 2)
    assert len(groups) == 2 and not {d.id for d in groups[0]} & {d.id for d in groups[1]}
    with pytest.raises(ValueError, match="num_partitions"):
        split_devices(jax.devices()[:3], 2)


def test_fit_spec_drops_axes_that_do_not_divide():
    mesh = make_partition_mesh(jax.devices()[:8], tensor=2)
    assert fit_spec(PartitionSpec(("tensor", "fsdp"), None), (260, 64), mesh) == PartitionSpec(
        "tensor"
    )
    assert fit_spec(PartitionSpec(("tensor", "fsdp")), (264, 64), mesh) == PartitionSpec(
        ("tensor", "fsdp")
    )
    assert fit_spec(PartitionSpec("fsdp", "tensor"), (6, 64), mesh) == PartitionSpec(None, "tensor")


def test_parameter_and_optimizer_shardings_follow_the_annotations():
    mesh = make_partition_mesh(jax.devices()[:8], data=2, tensor=2)
    inner = InnerStep(get_config("tiny"), mesh=mesh)
    specs = {
        jax.tree_util.keystr(path): s.spec
        for path, s in jax.tree_util.tree_leaves_with_path(inner.param_shardings)
    }
    assert specs["['layers'][0]['mlp']['gate_proj']['kernel'].value"] == PartitionSpec(
        "fsdp", "tensor"
    )
    assert specs["['layers'][0]['mlp']['down_proj']['kernel'].value"] == PartitionSpec(
        "tensor", "fsdp"
    )
    assert specs["['lm_head']['kernel'].value"] == PartitionSpec("fsdp", "tensor")
    assert specs["['final_norm']['scale'].value"] == PartitionSpec()
    # AdamW moments are sharded like the parameters; the step count is replicated.
    opt_specs = [s.spec for s in jax.tree.leaves(inner.opt_shardings)]
    param_specs = [s.spec for s in jax.tree.leaves(inner.param_shardings)]
    assert opt_specs.count(PartitionSpec("fsdp", "tensor")) == 2 * param_specs.count(
        PartitionSpec("fsdp", "tensor")
    )
    again = shardings_for(inner.abstract_params, mesh)
    assert jax.tree.leaves(again) == jax.tree.leaves(inner.param_shardings)
    # Nothing is sharded over data (replicated there); batches are split over data x fsdp.
    every = {a for s in param_specs for e in s if e for a in ((e,) if isinstance(e, str) else e)}
    assert every == {"fsdp", "tensor"}
    assert inner.batch_sharding.spec == PartitionSpec(("data", "fsdp"))


def test_the_learner_process_builds_the_mesh_the_launcher_asked_for(monkeypatch):
    from dipsjax.launch.core import Requirements
    from dipsjax.runtime.learner import partition_mesh

    env = Requirements(cpu_devices=len(jax.devices()), mesh_data=2, mesh_tensor=2).env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    mesh = partition_mesh()
    assert dict(mesh.shape) == {"data": 2, "fsdp": len(jax.devices()) // 4, "tensor": 2}
    monkeypatch.setenv("DIPSJAX_PARTITION_MESH", "2,2")
    with pytest.raises(RuntimeError, match="DIPSJAX_PARTITION_MESH must be 'data,fsdp,tensor'"):
        partition_mesh()
    monkeypatch.delenv("DIPSJAX_PARTITION_MESH")
    assert dict(partition_mesh().shape) == {"data": 1, "fsdp": len(jax.devices()), "tensor": 1}
