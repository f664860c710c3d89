"""The follower process's driver carries out the core's commands in order, deciding
nothing: the journal (a decided round's inputs, a step's ``Apply``) is on disk before the
report and one that fails ends the process non-zero with the report unsent; the
checkpoint is started after the report, written while the next round goes on, and waited
for only before the next outer step, which then frees the journal it covers."""

import json
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from dipsjax import outer
from dipsjax.runtime.follower import FollowerNode
from dipsjax.syncer import Follower
from dipsjax.syncer import messages as m


class _Checkpoints:
    def __init__(self, log, fail=None):
        self.fail, self.log = fail, log

    def save(self, step, state, meta, copy=True):
        if self.fail:
            raise self.fail
        self.log.append(("checkpoint", step, meta["version"], copy))

    def wait(self):
        self.log.append(("wait",))

    def close(self):
        if self.fail:
            raise self.fail
        self.log.append(("close",))


def _core(version=0):
    return Follower(
        1, {"w": np.zeros((2, 3), np.float32)}, outer.diloco(), capacity=2, version=version
    )


def _node(tmp_path, follower=None, fail=None):
    """A driver without its servers (``FollowerNode`` without ``__init__``): a real core, a
    real journal in ``tmp_path``, checkpoints and control client that log what they do."""
    node = FollowerNode.__new__(FollowerNode)
    node.log, node.sent = [], []
    node.k = 1
    node.spec = type(
        "Spec",
        (),
        {
            "checkpoints": True,
            "run_dir": str(tmp_path),
            "apply_delay": 0.0,
            "compute_in_turns": False,
        },
    )()
    node.lock = threading.Lock()
    node.ckpt = _Checkpoints(node.log, fail)
    node.control = type("C", (), {})()
    node.control.call = lambda ev: node.sent.append(ev) or node.log.append("send")
    node.follower = follower or _core()
    node.saving, node.checkpointed, node.exit_code = None, 0, 0
    node._batch_writes, node.checkpointed_pruned = {}, -1
    node._after_apply = lambda *a: node.log.append(("after", *a))
    return node


def _applied_round(f, r=4):
    """Round ``r`` staged, merged and applied by core ``f``; returns the commands of its
    ``Apply``."""
    f.receive(r, 0, {"w": jnp.full((2, 3), 0.3, jnp.bfloat16)})
    f.receive(r, 1, {"w": jnp.full((2, 3), -1.7, jnp.bfloat16)})
    f.partial_norms(r, (0, 1), (f.version,) * 2)
    d = m.Decide(r, (0, 1), (True, False), (5, 6), (2, 2), (1.0, 0.0), (0.1, 0.2))
    merged = f.merged_partial(d)
    return d, f.handle(m.Apply(r, f.version + 1, 1.0, merged), 1.0)


def test_the_step_is_journaled_before_the_report_and_the_checkpoint_started_after(tmp_path):
    node = _node(tmp_path)
    d, commands = _applied_round(node.follower)
    assert [type(c).__name__ for c in commands] == ["Save", "Send", "Save"]
    assert FollowerNode.carry_out(node, commands, 0.25) is True
    journal = tmp_path / "follower1" / "journal" / f"applied-v{1:09d}-r{4:09d}.json"
    doc = json.loads(journal.read_text())
    assert m.from_json(doc["apply"]) == node.follower.last_applied[1]
    assert doc["ended"] == [[4, 4]]
    # No wait: the checkpoint is written from the live buffers while the next round runs.
    assert node.log == [
        "send",
        ("checkpoint", 1, 1, False),
        ("after", d, node.follower.last_applied[1], 1, 0.25),
    ]
    assert node.saving == 1 and list(tmp_path.glob("follower1/journal/*.tmp")) == []


def test_a_failed_journal_write_exits_non_zero_without_reporting_the_step(tmp_path):
    node = _node(tmp_path)
    (tmp_path / "follower1").write_text("not a folder")  # the write fails
    _, commands = _applied_round(node.follower)
    with pytest.raises(SystemExit) as e:
        FollowerNode.carry_out(node, commands)
    assert "saving the step of round 4 failed, not reporting it" in str(e.value.code)
    assert node.sent == [] and node.log == []


def test_a_checkpoint_that_cannot_start_exits_non_zero_after_the_report(tmp_path):
    """The step is in the journal and reported: a restart redoes it from there."""
    node = _node(tmp_path, fail=OSError("No space left on device"))
    _, commands = _applied_round(node.follower)
    with pytest.raises(SystemExit) as e:
        FollowerNode.carry_out(node, commands)
    assert "checkpoint of version 1 failed" in str(e.value.code)
    assert node.log == ["send"] and len(list(tmp_path.glob("follower1/journal/applied-*"))) == 1


def test_the_next_step_waits_for_the_checkpoint_then_frees_the_journal_it_covers(tmp_path):
    node = _node(tmp_path)
    journal = tmp_path / "follower1" / "journal"
    journal.mkdir(parents=True)
    names = [
        f"{kind}-v{v:09d}-r{v + 10:09d}.{ext}"
        for v in range(1, 6)
        for kind, ext in (("batch", "bin"), ("decided", "json"), ("applied", "json"))
    ]
    for name in names:
        (journal / name).write_bytes(b"")
    FollowerNode._checkpoint_written(node)  # nothing being written: nothing to wait for
    assert node.log == [] and len(list(journal.iterdir())) == len(names)
    node.saving = 3
    FollowerNode._checkpoint_written(node)
    assert node.log == [("wait",)] and (node.saving, node.checkpointed) == (None, 3)
    # Kept: what redoes version 4 and on from the checkpoint of 3 (a round decided at 3).
    assert sorted(p.name for p in journal.iterdir()) == sorted(
        [f"batch-v{3:09d}-r{13:09d}.bin", f"decided-v{3:09d}-r{13:09d}.json"]
        + [
            f"{k}-v{v:09d}-r{v + 10:09d}.{e}"
            for v in (4, 5)
            for k, e in (("batch", "bin"), ("decided", "json"), ("applied", "json"))
        ]
    )


def test_a_decided_rounds_inputs_round_trip_through_the_journal_bit_for_bit(tmp_path):
    """``Save("inputs")`` writes the round's BF16 batch and Decide whole (no temporary file
    left); a process restarted at the same version reads them back into its core, which
    then holds the round (and lists it when it joins), with the same bits."""
    f = _core()
    f.receive(4, 0, {"w": jnp.full((2, 3), 0.3, jnp.bfloat16)})
    f.receive(4, 1, {"w": jnp.full((2, 3), -1.7, jnp.bfloat16)})
    f.partial_norms(4, (0, 1), (0, 0))
    d = m.Decide(4, (0, 1), (True, False), (5, 6), (2, 2), (1.0, 0.0), (0.1, 0.2))
    f.merged_partial(d)
    node = _node(tmp_path, f)
    FollowerNode._save_batch(node, 4, 0)  # started at the norms, in its thread
    FollowerNode._save_inputs(node, 4, 0)  # waited for at the merge
    assert node._batch_writes == {}
    assert [p.name for p in tmp_path.glob("follower1/*")] == ["journal"]  # not a shard file
    assert sorted(p.name for p in tmp_path.glob("follower1/journal/*")) == [
        f"batch-v{0:09d}-r{4:09d}.bin",
        f"decided-v{0:09d}-r{4:09d}.json",
    ]
    torn = tmp_path / "follower1" / "journal" / "batch-v000000007-r000000009.bin.tmp"
    torn.write_bytes(b"torn")  # a write the dead process did not finish: not an entry
    again = _node(tmp_path)
    FollowerNode._redo(again, None, None)
    assert again.follower.decided_rounds() == (4,) and again.follower.version == 0
    assert not torn.exists()
    got_d, got = again.follower.round_inputs(4)
    assert got_d == d
    want = f.round_inputs(4)[1]["w"]
    assert got["w"].dtype == jnp.bfloat16 and want.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(got["w"]).view(np.uint16), np.asarray(want).view(np.uint16)
    )


def _two_journaled_steps(node):
    """Rounds 4 and 5 through ``node``'s core and driver: versions 1 and 2, journaled."""
    f = node.follower
    for r in (4, 5):
        f.receive(r, 0, {"w": jnp.full((2, 3), 0.3 * r, jnp.bfloat16)})
        f.receive(r, 1, {"w": jnp.full((2, 3), -1.7, jnp.bfloat16)})
        f.partial_norms(r, (0, 1), (f.version,) * 2)
        d = m.Decide(r, (0, 1), (True, True), (5, 6), (2, 2), (0.5, 0.5), (0.1, 0.2))
        FollowerNode.carry_out(node, f.handle(d, 1.0))
        FollowerNode.carry_out(node, f.handle(m.Apply(r, f.version + 1, 0.8, 1.0), 2.0))


def test_a_restart_redoes_the_journaled_steps_and_refuses_a_version_it_cannot_reach(tmp_path):
    """Two steps journaled after the checkpoint of version 0: ``--resume latest`` redoes
    both (the live core's parameters, bit for bit); ``--resume 1`` redoes one and deletes
    the entries of the step past it; a resume at a version the journal does not reach
    fails naming it."""
    live = _node(tmp_path)
    _two_journaled_steps(live)
    assert live.follower.version == 2
    again = _node(tmp_path)
    FollowerNode._redo(again, None, None)
    assert again.follower.version == 2
    assert (
        np.asarray(again.follower.params["w"]).tobytes()
        == np.asarray(live.follower.params["w"]).tobytes()
    )
    with pytest.raises(FileNotFoundError, match="cannot resume at version 3: its checkpoint"):
        FollowerNode._redo(_node(tmp_path), 3, None)
    one = _node(tmp_path)
    FollowerNode._redo(one, 1, None)
    assert one.follower.version == 1
    assert sorted(p.name[:11] for p in tmp_path.glob("follower1/journal/*")) == [
        "applied-v00",
        "batch-v0000",
        "batch-v0000",
        "decided-v00",
        "decided-v00",
    ]


def test_exit_ends_the_serving_loop_with_its_code(tmp_path):
    node = _node(tmp_path)
    stop = [m.Exit(m.ExitCode.OK, "budget reached"), m.Send(m.FollowerHeartbeat(0.0, 1))]
    assert FollowerNode.carry_out(node, stop) is False
    assert node.exit_code == 0 and node.sent == []


def test_a_failed_inputs_save_exits_non_zero_without_reporting_the_merge(tmp_path):
    f = _core()
    f.receive(2, 0, {"w": np.ones((2, 3))})
    f.partial_norms(2, (0,), (0,))
    d = m.Decide(2, (0,), (True,), (5,), (2,), (1.0,), (0.1,))
    node = _node(tmp_path, f)
    (tmp_path / "follower1").write_text("not a folder")  # the write fails
    with pytest.raises(SystemExit) as e:
        FollowerNode.carry_out(node, f.handle(d, 1.0))
    assert "saving the batch of round 2 failed, not reporting its merge" in str(e.value.code)
    assert node.sent == []


def test_a_redone_step_is_logged_once_where_the_dead_process_did_not_log_it(tmp_path):
    """Bug (found by the follower-kill test): killed between a step's report and its
    bookkeeping, the follower's restart redid the step from its journal but its
    ``decisions.jsonl`` lacked that version, so the followers' decision logs differed from
    the tape's. Now the restart logs each redone step the log lacks, and only those."""
    live = _node(tmp_path)
    live._after_apply = lambda d, a, v, s: FollowerNode._log_decision(live, d, a) if v == 1 else 0
    _two_journaled_steps(live)  # version 2's bookkeeping never ran: killed before
    log = tmp_path / "follower1" / "decisions.jsonl"
    assert [json.loads(x)["version"] for x in log.read_text().splitlines()] == [1]
    FollowerNode._redo(_node(tmp_path), None, None)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["version"], x["round"], x["tokens"]) for x in lines] == [(1, 4, 11), (2, 5, 11)]


def test_a_batch_file_cut_short_is_named(tmp_path):
    from dipsjax.runtime.follower import _read_arrays, _write_arrays

    path = tmp_path / "batch.bin"
    x = {"a/w": np.arange(6, dtype=np.uint16).reshape(2, 3), "b": np.ones(4, np.float32)}
    with path.open("wb") as fh:
        _write_arrays(fh, x, {"a/w": "bfloat16", "b": "float32"})
    got, dtypes = _read_arrays(path)
    assert dtypes == {"a/w": "bfloat16", "b": "float32"}
    for k, want in x.items():
        assert got[k].dtype == want.dtype and got[k].tobytes() == want.tobytes()
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])
    with pytest.raises(ValueError, match=r"batch\.bin: tensor b is cut short"):
        _read_arrays(path)
    path.write_bytes(whole[:20])
    with pytest.raises(ValueError, match=r"batch\.bin: its header is cut short or not JSON"):
        _read_arrays(path)


def test_a_repeated_apply_waits_for_the_checkpoint_but_keeps_the_journal(tmp_path):
    """Bug (review): every ``Apply`` trimmed the journal to the newest checkpoint, a
    repeated one too (sent again to a follower that joined twice while the leader applied
    the round), though the leader had not counted that version yet: a run resumed from the
    leader's snapshot then lacked the round's inputs. Only the next version's ``Apply``
    (the leader counted this one) trims it now."""
    node = _node(tmp_path)
    f = node.follower
    for r in (4, 5):
        f.receive(r, 0, {"w": jnp.full((2, 3), 0.5, jnp.bfloat16)})
        f.receive(r, 1, {"w": jnp.full((2, 3), -1.5, jnp.bfloat16)})
        FollowerNode.handle(node, m.RequestNorms(r, (0, 1), (f.version,) * 2))
        d = m.Decide(r, (0, 1), (True, True), (5, 6), (2, 2), (0.5, 0.5), (0.1, 0.2))
        FollowerNode.handle(node, d)
        apply = m.Apply(r, f.version + 1, 0.8, 1.0)
        FollowerNode.handle(node, apply)
        assert node.saving == f.version  # its checkpoint is being written
        names = sorted(p.name[:9] for p in (tmp_path / "follower1" / "journal").iterdir())
        FollowerNode.handle(node, apply)  # the same Apply again
        assert node.log[-2:] == [("wait",), "send"] and node.saving is None
        assert sorted(p.name[:9] for p in (tmp_path / "follower1" / "journal").iterdir()) == names
    # Round 5's Apply (version 2) told it the leader counted version 1: what the checkpoint
    # of 1 holds is gone, round 5's entries stay.
    assert sorted(p.name for p in (tmp_path / "follower1" / "journal").iterdir()) == [
        f"applied-v{2:09d}-r{5:09d}.json",
        f"batch-v{1:09d}-r{5:09d}.bin",
        f"decided-v{1:09d}-r{5:09d}.json",
    ]


def test_a_checkpoint_failing_at_exit_makes_the_exit_code_non_zero(tmp_path):
    """Review: a checkpoint that failed in flight at exit raised out of the exit's
    ``finally``, skipping the rest of it (CPU seconds, the last log line). Now it is
    logged, the exit code says so, and the exit goes on."""
    node = _node(tmp_path, fail=OSError("No space left on device"))
    node.saving = 7
    FollowerNode._close_checkpoints(node)
    assert node.exit_code == 1
    ok = _node(tmp_path)
    FollowerNode._close_checkpoints(ok)
    assert ok.exit_code == 0 and ok.log == [("close",)]


def test_a_decide_without_its_batch_is_named(tmp_path):
    f = _core()
    f.receive(4, 0, {"w": jnp.full((2, 3), 0.3, jnp.bfloat16)})
    f.partial_norms(4, (0,), (0,))
    f.merged_partial(m.Decide(4, (0,), (True,), (5,), (2,), (1.0,), (0.1,)))
    FollowerNode._save_inputs(_node(tmp_path, f), 4, 0)
    next((tmp_path / "follower1" / "journal").glob("batch-*")).unlink()
    with pytest.raises(ValueError, match=r"decided-v000000000-r000000004\.json has no batch"):
        FollowerNode._redo(_node(tmp_path), None, None)


def test_a_report_cut_by_the_leaders_death_still_gets_the_steps_bookkeeping(tmp_path):
    # Found by test_faults' leader kill (a fresh-clone run, 2026-12-06): the leader died
    # between a follower's outer step and its report. The step was taken and journaled and
    # the follower rejoined at its new version, but the failed send skipped the step's
    # bookkeeping: its line in decisions.jsonl, its log line, its timing.
    import grpc

    class Gone(grpc.RpcError):
        pass

    node = _node(tmp_path)
    d, commands = _applied_round(node.follower)

    def call(ev):
        raise Gone("leader gone")

    node.control.call = call
    with pytest.raises(Gone):
        FollowerNode.carry_out(node, commands, 0.25)
    journal = tmp_path / "follower1" / "journal" / f"applied-v{1:09d}-r{4:09d}.json"
    assert journal.exists() and node.follower.version == 1
    assert node.log == [("after", d, node.follower.last_applied[1], 1, 0.25)]
