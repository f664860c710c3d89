"""``dipsjax export``: a run's saved shards out as orbax + safetensors, and back into its model."""

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from safetensors.numpy import load_file

from dipsjax import cli, export, outer
from dipsjax.learner.step import params_to_dict
from dipsjax.model.configs import get_config
from dipsjax.model.llama import Llama
from dipsjax.runtime.follower import FollowerNode
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig
from dipsjax.task import Task

FOLLOWERS = 2


def _loss(model, batch):
    logits = model(batch["inputs"])
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1).mean()


TINY = Task(
    name="lm-tiny",
    model=lambda rngs: Llama(get_config("tiny"), rngs=rngs),
    loss=_loss,
    data=lambda: None,  # never read here
)


def tiny_task(cfg):
    """The run's task, by import path (``SimConfig.task``): the tiny LLaMA."""
    return TINY


def _model(seed):
    return Llama(get_config("tiny"), rngs=nnx.Rngs(seed))


def _params(model):
    return jax.device_get(params_to_dict(nnx.state(model, nnx.Param)))


def _save_version(run, layer_owner, name, version, params):
    """Every follower's shard of ``params``, saved by the follower's own code
    (``FollowerNode.save``: ``follower{k}/NAME.npz``)."""
    paths = list(outer.flatten(params))
    shards = outer.split_tree(params, lambda p: layer_owner[paths.index(p)], FOLLOWERS)
    for k, shard in enumerate(shards):
        node = types.SimpleNamespace(
            follower=types.SimpleNamespace(pull=lambda shard=shard: (version, shard)),
            spec=types.SimpleNamespace(run_dir=str(run)),
            k=k,
        )
        FollowerNode.save(node, name)


def _write_spec(run, layer_owner):
    spec = RunSpec(
        sim=SimConfig(task=f"{__name__}:tiny_task", model="tiny", followers=FOLLOWERS),
        leader="",
        followers=tuple(f"127.0.0.1:{9000 + k}" for k in range(FOLLOWERS)),
        credentials="",
        run_dir=str(run),
        layer_owner=tuple(layer_owner),
        num_chunks=0,
    )
    run.mkdir(parents=True, exist_ok=True)
    spec.write(run / "spec.json")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run folder: versions 4 and 8 saved on the way, final at 10, and a version 12 only
    follower 0 saved (incomplete: never exported)."""
    run = tmp_path_factory.mktemp("exp") / "run"
    models = {v: _model(seed) for v, seed in ((4, 1), (8, 2), (10, 3))}
    params = {v: _params(m) for v, m in models.items()}
    layer_owner = [i % FOLLOWERS for i in range(len(outer.flatten(params[4])))]
    _write_spec(run, layer_owner)
    _save_version(run, layer_owner, "v4", 4, params[4])
    _save_version(run, layer_owner, "v8", 8, params[8])
    _save_version(run, layer_owner, "final", 10, params[10])
    _save_version(run, layer_owner, "v12", 12, params[10])
    (run / "follower1" / "v12.npz").unlink()
    return types.SimpleNamespace(dir=run, models=models, params=params)


def _export(*args, capsys=None):
    rc = cli.main(["export", *map(str, args)])
    return rc, (capsys.readouterr() if capsys is not None else None)


def _bits(x):
    x = np.asarray(x)
    assert x.dtype == np.float32
    return x.view(np.uint32)


def _same_bits(got, want):
    got, want = outer.flatten(got), outer.flatten(want)
    assert set(got) == set(want)
    for p in want:
        np.testing.assert_array_equal(_bits(got[p]), _bits(want[p]), err_msg="/".join(p))


def test_export_writes_the_final_parameters_bit_for_bit(run, tmp_path, capsys):
    out = tmp_path / "out"
    rc, io = _export(run.dir, "--out", out, capsys=capsys)
    assert rc == 0, io.err
    assert "version 10" in io.out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["version"] == 10 and meta["saved_as"] == "final"
    assert meta["task"] == f"{__name__}:tiny_task" and meta["model"] == "tiny"

    want = run.params[10]
    flat = load_file(str(out / "params.safetensors"))
    assert set(flat) == {"/".join(p) for p in outer.flatten(want)}
    assert "layers/0/attn/q_proj/kernel" in flat  # layer i of the list is "i"
    _same_bits(outer.unflatten({tuple(k.split("/")): x for k, x in flat.items()}), want)

    with ocp.StandardCheckpointer() as ckptr:  # a plain orbax reader, not ours
        restored = ckptr.restore((out / "params").absolute())
    _same_bits(restored, want)
    _same_bits(export.load_params(out), want)
    _same_bits(export.load_params(out, source="safetensors"), want)


def test_load_model_gives_the_runs_logits(run, tmp_path):
    out = tmp_path / "out"
    assert _export(run.dir, "--out", out)[0] == 0
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)
    want = np.asarray(run.models[10](tokens))
    # with the task given, and rebuilt from meta.json (the run's SimConfig names it)
    for model in (export.load_model(out, TINY), export.load_model(out)):
        assert isinstance(model, Llama)
        np.testing.assert_array_equal(np.asarray(model(tokens)), want)
    # the module was built from seed 0: its own logits differ, so the parameters went in
    assert not np.array_equal(np.asarray(_model(0)(tokens)), want)


def test_version_picks_a_saved_version(run, tmp_path):
    out = tmp_path / "out"
    assert _export(run.dir, "--out", out, "--version", 4)[0] == 0
    assert json.loads((out / "meta.json").read_text())["version"] == 4
    _same_bits(export.load_params(out), run.params[4])
    _same_bits(export.load_params(out, source="safetensors"), run.params[4])
    assert export.saved_versions(run.dir) == {4: "v4", 8: "v8", 10: "final"}


def test_a_version_not_saved_is_an_error_listing_the_saved_ones(run, tmp_path, capsys):
    out = tmp_path / "out"
    for missing in (5, 12):  # 12: only one of the two followers saved it
        rc, io = _export(run.dir, "--out", out, "--version", missing, capsys=capsys)
        assert rc != 0
        assert f"no saved version {missing}" in io.err
        assert "saved versions: 4, 8, 10" in io.err
        assert "v12 (saved by follower0 only, of 2 followers)" in io.err
        assert not out.exists()  # nothing written


def test_a_run_without_shards_is_an_error(run, tmp_path, capsys):
    empty = tmp_path / "empty"
    _write_spec(empty, [0, 1])
    rc, io = _export(empty, "--out", tmp_path / "out", capsys=capsys)
    assert rc != 0 and "has no saved parameters" in io.err
    rc, io = _export(tmp_path / "nothing", "--out", tmp_path / "out", capsys=capsys)
    assert rc != 0 and "not a run folder" in io.err
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_non_empty_out_unless_forced(run, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc, io = _export(run.dir, "--out", out, capsys=capsys)
    assert rc != 0 and "not empty" in io.err and "--force" in io.err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]

    assert _export(run.dir, "--out", out, "--force")[0] == 0
    assert _export(run.dir, "--out", out, "--version", 8, "--force")[0] == 0  # replaces it
    assert json.loads((out / "meta.json").read_text())["version"] == 8
    _same_bits(export.load_params(out), run.params[8])
    _same_bits(export.load_params(out, source="safetensors"), run.params[8])
    assert (out / "notes.txt").read_text() == "mine"


def test_an_export_loads_into_a_model_whose_layers_are_scanned(run, tmp_path):
    """The export is the unrolled model's dict; ``put_params`` stacks it into a model built
    with ``scan_layers`` (issue 21), whose logits are the run's to float32 rounding."""
    out = tmp_path / "out"
    assert _export(run.dir, "--out", out)[0] == 0
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)
    want = np.asarray(run.models[10](tokens))
    scanned = Llama(get_config("tiny", scan_layers=True), rngs=nnx.Rngs(1))
    export.put_params(scanned, export.load_params(out))
    np.testing.assert_allclose(np.asarray(scanned(tokens)), want, rtol=1e-5, atol=1e-5)
    stacked = nnx.state(scanned, nnx.Param)["layers"]["mlp"]["up_proj"]["kernel"].get_value()
    np.testing.assert_array_equal(
        stacked[1],
        params_to_dict(nnx.state(run.models[10], nnx.Param))["layers"]["1"]["mlp"]["up_proj"][
            "kernel"
        ],
    )
