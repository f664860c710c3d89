"""``dipsjax export RUN_DIR --out DIR``: a run's model, out of the run, into its task's module.

A run keeps its global parameters in shards, one per follower: every follower saves its
shard as ``RUN_DIR/follower{k}/v{V}.npz`` every ``eval_every`` versions and as
``final.npz`` when the run ends. ``dipsjax export`` merges the shards of one saved version
(:func:`dipsjax.launch.run.load_params`; by default the newest, which is the run's final
model; ``--version V`` another one) and writes

* ``DIR/params/``: an orbax checkpoint (``StandardCheckpointer``) of the parameters as a
  nested dict of float32 NumPy arrays, keyed as the learners' parameter dicts are (the
  module's attribute names, layer ``i`` of a list as ``"i"``:
  :func:`dipsjax.learner.step.params_to_dict`);
* ``DIR/params.safetensors``: the same tensors, their keys the paths joined by ``/``
  (``layers/0/attn/q_proj/kernel``...), with the version and task in the file's metadata;
* ``DIR/meta.json``: the version (and which saved set it came from), the task (its import
  path, ``task_args``, the model's name) and the run's whole
  :class:`~dipsjax.sim.config.SimConfig`, from which :func:`load_model` rebuilds the task.

``DIR`` must be empty or new; ``--force`` replaces these three entries of a ``DIR`` that
holds them (anything else there is left alone).

Loading them back: :func:`load_params` gives the nested dict (from the orbax checkpoint, or
``source="safetensors"``); :func:`load_model` builds the task's module
(``task.model(nnx.Rngs(0))``) and puts the parameters into its ``nnx.Param`` leaves. With no
task, it rebuilds the run's own from ``meta.json`` (:func:`dipsjax.task.load_task`: for the
built-in language model, the LLaMA of ``spec.sim.model``), which needs the task's module
importable. Sampling from a run of the built-in byte-level language model::

    # dipsjax export runs/quickstart-20260101-120000 --out exported
    import jax.numpy as jnp
    from dipsjax import export
    from dipsjax.data import ByteTokenizer

    model = export.load_model("exported")         # an nnx.Module (here dipsjax's Llama)
    tok = ByteTokenizer()
    ids = list(tok.encode("It is a truth universally"))
    for _ in range(40):                            # greedy decoding, one byte at a time
        logits = model(jnp.asarray([ids], jnp.int32))   # [1, len(ids), vocab], float32
        ids.append(int(logits[0, -1].argmax()))
    print(tok.decode(ids))

Fine-tuning it further is ordinary NNX (``task`` the run's :class:`~dipsjax.task.Task`, or
one of your own whose model has the same parameters)::

    import optax
    from flax import nnx

    model = export.load_model("exported", task)
    opt = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, batch):
        loss, grads = nnx.value_and_grad(task.loss)(model, batch)
        opt.update(model, grads)
        return loss

Parameters in other frameworks: ``safetensors.numpy.load_file("exported/params.safetensors")``
gives ``{"layers/0/attn/q_proj/kernel": array, ...}`` (kernels are ``[in, out]``, as
``nnx.Linear`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dipsjax import outer
from dipsjax.launch.run import load_params as load_shards
from dipsjax.launch.run import shard_files
from dipsjax.runtime.spec import RunSpec, write_json

if TYPE_CHECKING:
    from dipsjax.sim.config import SimConfig
    from dipsjax.task import Task

#: What an export writes in its folder (``--force`` replaces these, and only these).
ORBAX_DIR = "params"
SAFETENSORS_FILE = "params.safetensors"
META_FILE = "meta.json"
FORMAT = "dipsjax-export/1"

_SAVED_NAME = re.compile(r"final|v(\d+)")


class ExportError(Exception):
    """Why a run's parameters cannot be exported (the message says what to do)."""


# -- the run's saved versions -----------------------------------------------------------------


def read_spec(run_dir: str | Path) -> RunSpec:
    """The run's spec (``RUN_DIR/spec.json``); an :class:`ExportError` if it has none."""
    path = Path(run_dir) / "spec.json"
    if not path.is_file():
        raise ExportError(f"{path} not found: {run_dir} is not a run folder")
    return RunSpec.read(path)


def saved_versions(run_dir: str | Path, spec: RunSpec | None = None) -> dict[int, str]:
    """``{version: name}`` of every complete set of shards the followers saved (``name``:
    ``"final"`` or ``"v{version}"``; ``final`` where both hold one version). A set is
    complete when every follower of the run saved its shard of it."""
    return _scan(Path(run_dir), spec or read_spec(run_dir))[0]


def _scan(run_dir: Path, spec: RunSpec) -> tuple[dict[int, str], list[str]]:
    """The complete sets (as :func:`saved_versions`), and a line for each incomplete one."""
    n = len(spec.followers)
    names = {p.stem for p in run_dir.glob("follower*/*.npz") if _SAVED_NAME.fullmatch(p.stem)}
    found: dict[int, str] = {}
    incomplete: list[str] = []
    for name in sorted(names, key=lambda s: (s == "final", s)):  # final last: it wins ties
        files = shard_files(run_dir, name)
        if n and len(files) != n:
            who = sorted(f.parent.name for f in files)
            incomplete.append(f"{name} (saved by {', '.join(who)} only, of {n} followers)")
            continue
        match = _SAVED_NAME.fullmatch(name)
        if match is not None and match.group(1) is not None:
            found[int(match.group(1))] = name
            continue
        versions = set()
        for f in files:
            with np.load(f) as z:
                versions.add(int(z["__version__"]))
        if len(versions) != 1:
            incomplete.append(f"{name} (followers ended at different versions {sorted(versions)})")
            continue
        found[versions.pop()] = name
    return dict(sorted(found.items())), incomplete


def run_params(
    run_dir: str | Path, version: int | None = None, spec: RunSpec | None = None
) -> tuple[int, str, dict[str, Any]]:
    """``(version, name, params)``: the followers' shards of one saved version, merged into
    one nested dict of float32 arrays (default: the newest saved version). Raises an
    :class:`ExportError` naming the saved versions when ``version`` is not one of them, or
    when the run saved none."""
    run_dir = Path(run_dir)
    spec = spec or read_spec(run_dir)
    saved, incomplete = _scan(run_dir, spec)
    partial = f"; incomplete sets, not exported: {'; '.join(incomplete)}" if incomplete else ""
    if not saved:
        raise ExportError(
            f"{run_dir} has no saved parameters: no follower*/final.npz or follower*/v*.npz "
            f"shards from all of its {len(spec.followers)} followers{partial}"
        )
    if version is None:
        version = max(saved)
    elif version not in saved:
        raise ExportError(
            f"{run_dir} has no saved version {version}; saved versions: "
            f"{', '.join(map(str, saved))}{partial}"
        )
    name = saved[version]
    got, params = load_shards(shard_files(run_dir, name))
    if got != version:
        raise ExportError(f"{run_dir}: the {name} shards hold version {got}, not {version}")
    flat = outer.flatten(params)
    if spec.layer_owner and len(flat) != len(spec.layer_owner):
        raise ExportError(
            f"{run_dir}: the {name} shards hold {len(flat)} tensors, the run's model has "
            f"{len(spec.layer_owner)}"
        )
    return version, name, outer.unflatten({p: _float32(p, x) for p, x in flat.items()})


def _float32(path: tuple[str, ...], x: Any) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x
    if not np.issubdtype(x.dtype, np.floating):
        raise ExportError(f"parameter {'/'.join(path)}: dtype {x.dtype}, not a float")
    return x.astype(np.float32)


# -- writing -----------------------------------------------------------------------------------


def export(
    run_dir: str | Path, out: str | Path, version: int | None = None, force: bool = False
) -> dict[str, Any]:
    """Writes version ``version`` (default: the newest saved) of run ``run_dir`` to ``out``
    (see the module docstring); returns what ``meta.json`` says. ``out`` must be empty or
    new, unless ``force``: then the export's own entries there are replaced."""
    run_dir, out = Path(run_dir), Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"--out {out} is not empty (use --force to replace an export there)")
    spec = read_spec(run_dir)
    version, name, params = run_params(run_dir, version, spec)  # before anything is written
    sim = spec.sim
    from dipsjax.task import DEFAULT

    meta = {
        "format": FORMAT,
        "version": version,
        "saved_as": name,
        "task": sim.task or DEFAULT,
        "task_args": [list(kv) for kv in sim.task_args],
        "model": sim.model,
        "method": sim.method,
        "run_dir": str(run_dir.absolute()),
        "tensors": len(outer.flatten(params)),
        "sim": spec.to_json()["sim"],
    }
    out.mkdir(parents=True, exist_ok=True)
    for entry in (out / META_FILE, out / SAFETENSORS_FILE):
        entry.unlink(missing_ok=True)
    if (out / ORBAX_DIR).exists():
        shutil.rmtree(out / ORBAX_DIR)
    _write_orbax(out / ORBAX_DIR, params)
    _write_safetensors(out / SAFETENSORS_FILE, params, meta)
    write_json(out / META_FILE, meta, indent=1)  # last: an export with meta.json is whole
    return meta


def _write_orbax(path: Path, params: dict[str, Any]) -> None:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, params)
        ckptr.wait_until_finished()


def _write_safetensors(path: Path, params: dict[str, Any], meta: dict[str, Any]) -> None:
    from safetensors.numpy import save_file

    flat = {"/".join(p): np.ascontiguousarray(x) for p, x in outer.flatten(params).items()}
    header = {"format": FORMAT, "version": str(meta["version"]), "task": meta["task"]}
    save_file(flat, str(path), metadata=header)


# -- loading -----------------------------------------------------------------------------------


def read_meta(directory: str | Path) -> dict[str, Any]:
    """An export's ``meta.json``."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {directory} is not a dipsjax export")
    return json.loads(path.read_text())


def load_params(directory: str | Path, source: str = "orbax") -> dict[str, Any]:
    """The exported parameters: a nested dict (string keys, layer ``i`` as ``"i"``) of
    float32 NumPy arrays, read from the orbax checkpoint (``source="orbax"``) or from
    ``params.safetensors`` (``source="safetensors"``); both hold the same bits."""
    directory = Path(directory).absolute()
    if source == "orbax":
        import orbax.checkpoint as ocp

        path = directory / ORBAX_DIR
        if not path.is_dir():
            raise FileNotFoundError(f"{path} not found: {directory} is not a dipsjax export")
        with ocp.StandardCheckpointer() as ckptr:
            tree = ckptr.restore(path)
        return _numpy_tree(tree)
    if source == "safetensors":
        from safetensors.numpy import load_file

        path = directory / SAFETENSORS_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: {directory} is not a dipsjax export")
        return outer.unflatten({tuple(k.split("/")): x for k, x in load_file(str(path)).items()})
    raise ValueError(f"source must be 'orbax' or 'safetensors', got {source!r}")


def _numpy_tree(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {str(k): _numpy_tree(v) for k, v in tree.items()}
    return np.asarray(tree)


def sim_config(meta: Mapping[str, Any]) -> SimConfig:
    """The run's :class:`~dipsjax.sim.config.SimConfig`, from an export's meta."""
    # RunSpec.from_json is where a spec's JSON becomes a SimConfig (tuples and all).
    doc = {
        "sim": meta["sim"],
        "leader": "",
        "followers": [],
        "credentials": "",
        "run_dir": "",
        "layer_owner": [],
        "num_chunks": 0,
    }
    return RunSpec.from_json(doc).sim


def load_task(directory: str | Path) -> Task:
    """The run's task, rebuilt from the export's ``meta.json``
    (:func:`dipsjax.task.load_task` of the run's config)."""
    from dipsjax.task import load_task as task_of

    return task_of(sim_config(read_meta(directory)))


def put_params(model: Any, params: Mapping[str, Any]) -> Any:
    """Puts ``params`` (a nested dict as :func:`load_params` gives) into ``model``'s
    ``nnx.Param`` leaves, in place, cast to each leaf's dtype; returns ``model``. A
    ``ValueError`` names a missing or unexpected key, or a shape that does not fit."""
    import jax.numpy as jnp
    from flax import nnx

    from dipsjax.learner.step import params_from_dict, params_to_dict

    _, state, _ = nnx.split(model, nnx.Param, ...)
    dtypes = {p: x.dtype for p, x in outer.flatten(params_to_dict(state)).items()}
    given = {
        p: jnp.asarray(x, dtype=dtypes[p]) if p in dtypes else x
        for p, x in outer.flatten(params).items()
    }
    nnx.update(model, params_from_dict(state, outer.unflatten(given)))
    return model


def load_model(directory: str | Path, task: Task | None = None, seed: int = 0) -> Any:
    """The exported model as an ``nnx.Module``: ``task.model(nnx.Rngs(seed))`` with the
    exported parameters in its ``nnx.Param`` leaves (:func:`put_params`). ``task``: a
    :class:`dipsjax.task.Task` whose model has these parameters; default: the run's own,
    rebuilt from ``meta.json`` (:func:`load_task`)."""
    from flax import nnx

    params = load_params(directory)
    if task is None:
        task = load_task(directory)
    return put_params(task.model(nnx.Rngs(seed)), params)


# -- the command -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dipsjax export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's folder")
    parser.add_argument("--out", required=True, metavar="DIR", help="where to write the export")
    parser.add_argument(
        "--version",
        type=int,
        default=None,
        metavar="V",
        help="a saved version (default: the newest, the run's final parameters)",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an export already in a non-empty DIR"
    )
    args = parser.parse_args(argv)
    try:
        meta = export(args.run_dir, args.out, version=args.version, force=args.force)
    except (ExportError, ValueError, OSError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr, flush=True)
        return 1
    print(
        f"exported version {meta['version']} ({meta['saved_as']}, {meta['tensors']} tensors) "
        f"of {args.run_dir} to {Path(args.out) / ORBAX_DIR} and "
        f"{Path(args.out) / SAFETENSORS_FILE}; task {meta['task']}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
