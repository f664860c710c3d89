"""The evaluator (issue 19): validation of the versions the followers save, as they appear,
reported in ``RUN_DIR/eval.jsonl`` and TensorBoard (``tb/eval``), off the learners' path."""

import json
import math

import numpy as np
import pytest

from dipsjax import outer
from dipsjax.launch.run import make_spec
from dipsjax.runtime import evaluator, progress
from dipsjax.runtime.tbread import scalars
from dipsjax.sim.config import SimConfig

pytestmark = [pytest.mark.integration]


def _save(run_dir, version, params):
    """Version ``version`` as its follower saves it (``follower0/vV.npz``)."""
    out = run_dir / "follower0"
    out.mkdir(parents=True, exist_ok=True)
    arrays = {"/".join(p): np.asarray(x) for p, x in outer.flatten(params).items()}
    np.savez(out / f"v{version}.npz", __version__=np.asarray(version), **arrays)


def _round(version, tokens):
    participant = {"learner": 0, "meta": {"tokens": tokens}}
    return {
        "kind": "round",
        "version": version,
        "applied": True,
        "participants": [participant],
        "accepted": [True],
        "timings": {"ended": float(version)},
    }


def test_the_evaluator_reports_each_new_version_and_ends_with_the_job(tmp_path):
    run_dir = tmp_path / "run"
    spec = make_spec(SimConfig(learners=1, followers=1, eval_every=2), run_dir)
    ev = evaluator.Evaluator(spec)
    # Nothing saved yet: the initialization first (the baseline).
    first = ev.step()
    assert first["version"] == 0 and first["tokens"] == 0 and math.isfinite(first["val_loss"])
    assert ev.step() is None  # nothing new
    init = ev.world.init_params
    # A shard being written is tried again later, not taken.
    (run_dir / "follower0").mkdir()
    (run_dir / "follower0" / "v2.npz").write_bytes(b"PK\x03\x04 half a file")
    assert ev.step() is None
    # Two versions saved meanwhile: the newest is evaluated (the older one skipped).
    _save(run_dir, 2, init)
    moved = {
        k: v * 0.5 if k == ("embed", "embedding") else v for k, v in outer.flatten(init).items()
    }
    _save(run_dir, 4, outer.unflatten(moved))
    (run_dir / "tape.jsonl").write_text(
        "\n".join(json.dumps(_round(v, 100 * v)) for v in (1, 2, 3, 4)) + '\n{"kind": "rou'
    )
    point = ev.step()
    assert point["version"] == 4 and point["tokens"] == 100 + 200 + 300 + 400
    assert point["t"] == 4.0 and math.isfinite(point["val_loss"]) and point["val_bpb"] > 0
    # The figures of version 4's parameters (not version 2's, the initialization's),
    # computed here by World.evaluate on the parameters this test saved.
    mine = ev.world.evaluate(outer.unflatten(moved))
    assert point["val_loss"] == mine.loss and point["val_bpb"] == mine.bpb
    assert mine.bpb == pytest.approx(mine.loss / math.log(2))  # byte-level tokens
    assert point["val_loss"] != first["val_loss"] == ev.world.evaluate(init).loss
    lines = progress.read_validation(run_dir)
    assert [p["version"] for p in lines] == [0, 4] and lines[-1] == point
    assert "at version 4" in progress.validation_text(lines)
    # Once the job has stopped and nothing newer is saved, it ends; a new evaluator of the
    # same run (a resumed launch) takes up where it stopped.
    (run_dir / "leader").mkdir(exist_ok=True)
    (run_dir / "leader" / "snapshot.json").write_text(json.dumps({"stopped": True}))
    ev.run(poll=0.01)
    tb = scalars(run_dir / "tb" / "eval")  # (whole once the writer is closed)
    assert [s for s, _ in tb["live/val_loss"]] == [0, 1000]  # against the tokens applied
    assert tb["live/val_bpb"][-1][1] == pytest.approx(point["val_bpb"], rel=1e-6)
    again = evaluator.Evaluator(spec)
    assert again.done == {0, 4} and again.pending() is None


def test_a_task_s_own_figures_reach_eval_jsonl_tensorboard_and_the_console(tmp_path, monkeypatch):
    """A task with ``eval_metrics`` (two figures): each version's line carries them as
    ``val_<name>``, equal to ``World.evaluate``'s on the same parameters; TensorBoard has
    ``live/val_<name>``; the console line names them; no bits per byte for this task."""
    from tests.sim.test_task_api import FIGURES_TASK

    (tmp_path / "figures_task.py").write_text(FIGURES_TASK)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    spec = make_spec(SimConfig(task="figures_task:get_task", learners=1, followers=1), run_dir)
    ev = evaluator.Evaluator(spec)
    assert ev.step()["version"] == 0
    moved = {k: v * -0.5 for k, v in outer.flatten(ev.world.init_params).items()}
    _save(run_dir, 2, outer.unflatten(moved))
    point = ev.step()
    mine = ev.world.evaluate(outer.unflatten(moved))
    assert point["version"] == 2 and math.isnan(point["val_bpb"])
    assert point["val_loss"] == mine.loss
    assert (point["val_above"], point["val_mae"]) == (mine.metrics["above"], mine.metrics["mae"])
    assert mine.metrics["above"] != ev.world.evaluate(ev.world.init_params).metrics["above"]
    line = progress.read_validation(run_dir)[-1]
    assert line.keys() == point.keys() and line["val_above"] == point["val_above"]
    text = progress.validation_text([point])
    assert text == (
        f"val_loss {mine.loss:.4f}, val_above {point['val_above']:.4f}, val_mae "
        f"{point['val_mae']:.4f} at version 2"
    )
    ev.close()
    tb = scalars(run_dir / "tb" / "eval")
    assert "live/val_bpb" not in tb  # NaN: not written
    assert [v for _, v in tb["live/val_above"]][-1] == pytest.approx(point["val_above"])
    assert [v for _, v in tb["live/val_mae"]][-1] == pytest.approx(point["val_mae"], rel=1e-6)


def test_the_last_version_is_evaluated_though_it_is_no_save_point(tmp_path):
    """The job stops at version 5 (eval_every 2 saves 2 and 4): the evaluator waits for
    the followers' final shards, written as they shut down, and evaluates version 5; with
    none written in time it ends, without a point for it."""
    import threading

    run_dir = tmp_path / "run"
    spec = make_spec(SimConfig(learners=1, followers=1, eval_every=2), run_dir)
    ev = evaluator.Evaluator(spec)
    init = ev.world.init_params
    _save(run_dir, 4, init)
    (run_dir / "leader").mkdir(exist_ok=True)
    (run_dir / "leader" / "snapshot.json").write_text(json.dumps({"stopped": True, "version": 5}))
    moved = {k: v * 0.25 for k, v in outer.flatten(init).items()}

    def shut_down():  # the follower's final shard, a moment after the leader stopped
        import time

        time.sleep(0.3)
        arrays = {"/".join(p): np.asarray(x) for p, x in moved.items()}
        np.savez(run_dir / "follower0" / "final.npz", __version__=np.asarray(5), **arrays)

    t = threading.Thread(target=shut_down)
    t.start()
    ev.run(poll=0.01, final_wait=30)
    t.join()
    points = progress.read_validation(run_dir)
    assert [p["version"] for p in points] == [4, 5]
    assert points[-1]["val_loss"] == ev.world.evaluate(outer.unflatten(moved)).loss
    # A job whose last version never reaches the disk: the evaluator still ends.
    (run_dir / "leader" / "snapshot.json").write_text(json.dumps({"stopped": True, "version": 7}))
    again = evaluator.Evaluator(spec)
    again.run(poll=0.01, final_wait=0.2)
    assert [p["version"] for p in progress.read_validation(run_dir)] == [4, 5]
