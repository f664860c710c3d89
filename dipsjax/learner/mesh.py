"""Partition meshes and the shardings derived from parameter annotations.

A *partition* (one learner; a cluster, slice or host in the papers) trains over its own
device mesh with axes ``("data", "fsdp", "tensor")``, as MaxText names them:

* ``data``: plain data parallelism: the batch is split, parameters and optimizer state are
  replicated;
* ``fsdp``: the batch is split *and* the ``embed`` dimension of every weight (with its
  AdamW moments) is sharded (FSDP / ZeRO-3: weights are gathered where they are used);
* ``tensor``: heads, MLP and vocabulary are sharded (Megatron-style tensor parallelism);
  the batch is not split over it.

The logical axes the parameters carry are mapped to these by
:data:`dipsjax.model.LOGICAL_AXIS_RULES`. The default mesh puts every device on ``fsdp``.

Axis types are :attr:`jax.sharding.AxisType.Auto` on purpose: the train step is a pure
function whose inputs and outputs carry ``NamedSharding``\\ s, and the compiler (GSPMD /
Shardy) propagates shardings through the model, which therefore stays sharding-agnostic.
``Explicit`` axes would make sharding part of every array's type and require the model to
resolve each ambiguous contraction itself; that buys nothing here.

Meshes are always passed as arguments (no ``jax.set_mesh``), so several partitions on
disjoint sub-meshes can step concurrently from different threads of one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

#: The three axes of every partition mesh.
MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")
#: The axes a batch's leading dimension is split over.
BATCH_AXES: tuple[str, str] = ("data", "fsdp")


def mesh_shape(
    devices: int, *, data: int = 1, fsdp: int | None = None, tensor: int = 1
) -> tuple[int, int, int]:
    """The ``(data, fsdp, tensor)`` sizes of a mesh over ``devices`` devices; ``fsdp=None``
    takes the devices ``data`` and ``tensor`` leave. Errors name the axis at fault."""
    for name, v in (("data", data), ("tensor", tensor)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"partition mesh: {name} must be an integer >= 1, got {v!r}")
    if fsdp is None:
        if devices % (data * tensor):
            raise ValueError(
                f"partition mesh: data x tensor ({data} x {tensor}) must divide the "
                f"partition's {devices} devices"
            )
        fsdp = devices // (data * tensor)
    if not isinstance(fsdp, int) or isinstance(fsdp, bool) or fsdp < 1:
        raise ValueError(f"partition mesh: fsdp must be an integer >= 1, got {fsdp!r}")
    if data * fsdp * tensor != devices:
        raise ValueError(
            f"partition mesh: data x fsdp x tensor ({data} x {fsdp} x {tensor}) must equal "
            f"the partition's {devices} devices"
        )
    return data, fsdp, tensor


def make_partition_mesh(
    devices: Sequence[jax.Device] | None = None,
    *,
    data: int = 1,
    fsdp: int | None = None,
    tensor: int = 1,
) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh over exactly ``devices`` (default: all local devices).

    Args:
      devices: the partition's devices; their order is kept (row-major: neighbours along
        ``tensor`` are consecutive, then along ``fsdp``).
      data: size of the plain data-parallel axis.
      fsdp: size of the FSDP axis; ``None``: the devices ``data`` and ``tensor`` leave.
      tensor: size of the tensor-parallel axis.

    All axes are ``AxisType.Auto`` (see the module docstring; with ``Explicit`` axes the
    embedding gather, for one, would need an explicit ``out_sharding``).
    """
    devs = list(jax.local_devices() if devices is None else devices)
    if not devs:
        raise ValueError("make_partition_mesh needs at least one device")
    if len({d.id for d in devs}) != len(devs):
        raise ValueError("make_partition_mesh: devices must be distinct")
    shape = mesh_shape(len(devs), data=data, fsdp=fsdp, tensor=tensor)
    grid = np.array(devs, dtype=object).reshape(shape)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def split_devices(
    devices: Sequence[jax.Device] | None = None, num_partitions: int = 1
) -> list[list[jax.Device]]:
    """Splits ``devices`` (default: all local) into ``num_partitions`` disjoint equal groups."""
    devs = list(jax.local_devices() if devices is None else devices)
    if num_partitions < 1 or len(devs) % num_partitions:
        raise ValueError(
            f"split_devices: num_partitions must be >= 1 and divide the number of devices "
            f"({len(devs)}), got {num_partitions}"
        )
    size = len(devs) // num_partitions
    return [devs[i * size : (i + 1) * size] for i in range(num_partitions)]


def fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """Drops mesh axes from dimensions they do not divide evenly (those stay replicated).

    JAX requires even tiling; e.g. the byte vocabulary (260) over ``tensor = 8`` is kept
    whole. The rule is generic (per dimension), never chosen per array.
    """
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    out: list[Any] = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept: list[str] = []
        tiles = 1
        for ax in axes:
            if dim % (tiles * sizes[ax]) == 0:
                kept.append(ax)
                tiles *= sizes[ax]
        out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    while out and out[-1] is None:
        out.pop()
    return PartitionSpec(*out)


def shardings_for(tree: Any, mesh: Mesh) -> Any:
    """``NamedSharding`` for every leaf of an NNX state tree, from its partition metadata.

    Leaves inside ``nnx.Variable`` nodes annotated with ``nnx.with_partitioning`` use their
    logical axes mapped by their ``sharding_rules`` (``nnx.get_partition_spec``), then
    :func:`fit_spec`; plain array leaves (e.g. optimizer step counts) are replicated. Works
    on any tree derived from the parameters by ``jax.tree.map`` (gradients, AdamW moments),
    because those keep the ``Variable`` nodes and their metadata.
    """
    specs = nnx.get_partition_spec(tree)
    return jax.tree.map(
        lambda spec, leaf: NamedSharding(mesh, fit_spec(spec, leaf.shape, mesh)), specs, tree
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batches (every leaf: token batches ``[batch, seq + 1]``, a task's arrays) are split
    over ``data`` and ``fsdp`` (:data:`BATCH_AXES`) along their leading (batch) axis."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated over the partition (scalars, metrics)."""
    return NamedSharding(mesh, PartitionSpec())


def put_host(x: np.ndarray, sharding: jax.sharding.Sharding | jax.Device) -> jax.Array:
    """A host array (the same on every process) placed with ``sharding``. A sharding over
    several processes' devices (a partition spread over hosts) takes each process's part
    from its own copy (``make_array_from_callback``): ``jax.device_put`` would first check,
    by gathering every array from every process, that the copies agree."""
    if not isinstance(sharding, jax.sharding.Sharding) or sharding.is_fully_addressable:
        return jax.device_put(x, sharding, may_alias=False)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
