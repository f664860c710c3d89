"""Partition meshes over device lists and the shardings derived from annotations."""

import jax
import pytest
from jax.sharding import AxisType, PartitionSpec

from dipsjax.learner import make_partition_mesh, shardings_for, split_devices
from dipsjax.learner.mesh import fit_spec
from dipsjax.learner.step import InnerStep
from dipsjax.model import get_config


def test_mesh_over_given_devices():
    devices = jax.devices()[4:8]
    mesh = make_partition_mesh(devices, model=2)
    assert mesh.axis_names == ("data", "model")
    assert dict(mesh.shape) == {"data": 2, "model": 2}
    assert {d.id for d in mesh.devices.flat} == {d.id for d in devices}
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)


def test_default_mesh_is_all_local_devices_data_parallel():
    mesh = make_partition_mesh()
    assert dict(mesh.shape) == {"data": len(jax.local_devices()), "model": 1}


@pytest.mark.parametrize(("kwargs", "word"), [({"model": 3}, "model"), ({"data": 3}, "data")])
def test_bad_shapes_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        make_partition_mesh(jax.devices()[:4], **kwargs)


def test_split_devices_is_disjoint():
    groups = split_devices(jax.devices(), 2)
    assert len(groups) == 2 and not {d.id for d in groups[0]} & {d.id for d in groups[1]}
    with pytest.raises(ValueError, match="num_partitions"):
        split_devices(jax.devices()[:3], 2)


def test_fit_spec_drops_axes_that_do_not_divide():
    mesh = make_partition_mesh(jax.devices()[:8], model=2)
    assert fit_spec(PartitionSpec(("model", "data"), None), (260, 64), mesh) == PartitionSpec(
        "model"
    )
    assert fit_spec(PartitionSpec(("model", "data")), (264, 64), mesh) == PartitionSpec(
        ("model", "data")
    )
    assert fit_spec(PartitionSpec("data", "model"), (6, 64), mesh) == PartitionSpec(None, "model")


def test_parameter_and_optimizer_shardings_follow_the_annotations():
    mesh = make_partition_mesh(jax.devices()[:8], model=2)
    inner = InnerStep(get_config("tiny"), mesh=mesh)
    specs = {
        jax.tree_util.keystr(path): s.spec
        for path, s in jax.tree_util.tree_leaves_with_path(inner.param_shardings)
    }
    assert specs["['layers'][0]['mlp']['gate_proj']['kernel'].value"] == PartitionSpec(
        "data", "model"
    )
    assert specs["['layers'][0]['mlp']['down_proj']['kernel'].value"] == PartitionSpec(
        "model", "data"
    )
    assert specs["['lm_head']['kernel'].value"] == PartitionSpec("data", "model")
    assert specs["['final_norm']['scale'].value"] == PartitionSpec()
    # AdamW moments are sharded like the parameters; the step count is replicated.
    opt_specs = [s.spec for s in jax.tree.leaves(inner.opt_shardings)]
    param_specs = [s.spec for s in jax.tree.leaves(inner.param_shardings)]
    assert opt_specs.count(PartitionSpec("data", "model")) == 2 * param_specs.count(
        PartitionSpec("data", "model")
    )
    again = shardings_for(inner.abstract_params, mesh)
    assert jax.tree.leaves(again) == jax.tree.leaves(inner.param_shardings)
