"""A user's own training loop as a learner of a job (issue 19): a hand-written optax AdamW
loop over the tiny LLaMA contributes through :class:`Contributor` beside a built-in learner
process, and the job reaches its budget with both in its rounds and its books balanced."""

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dipsjax.runtime.contributor import ContributionRefused, Contributor, check_counts
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig


def _sim(**kw):
    return SimConfig(**{"method": "dips", "learners": 2, "followers": 2, **kw})


def test_bad_counts_are_refused_before_anything_is_sent(tmp_path):
    sim = _sim(inner_steps=4, batch_size=2, seq_len=8)  # batch_tokens 16
    spec = RunSpec(sim, "", (), "", str(tmp_path / "run"), (), 0, 1.0)
    assert spec.batch_tokens == 16
    c = Contributor(spec, learner=1)  # not started: nothing joined, nothing to send with
    params = {"w": np.zeros(3, np.float32)}
    with pytest.raises(ContributionRefused, match=r"tokens 65: 4 steps train 0 to 64"):
        c.contribute(params, tokens=65, steps=4)
    with pytest.raises(ContributionRefused, match=r"steps 5: .* inner_steps=4"):
        c.contribute(params, tokens=16, steps=5)
    with pytest.raises(ContributionRefused, match="steps 0"):
        c.contribute(params, tokens=0, steps=0)
    with pytest.raises(ContributionRefused, match="tokens -1"):
        c.contribute(params, tokens=-1, steps=1)
    with pytest.raises(ContributionRefused, match="must be an int"):
        c.contribute(params, tokens=1.5, steps=1)
    check_counts(spec, 64, 4)  # the bounds themselves are allowed
    check_counts(spec, 0, 1)
    assert not (tmp_path / "run").exists()  # nothing was written, started or sent
    with pytest.raises(ValueError, match=r"learners are 0 \.\. 1"):
        Contributor(spec, learner=2)
    # Dealt chunks would stay leased to a contributor, which never trains them.
    dealt = RunSpec(_sim(deal_chunks=True), "", (), "", str(tmp_path / "run"), (), 0, 1.0)
    with pytest.raises(ValueError, match=r"sim\.deal_chunks"):
        Contributor(dealt, learner=1)


def _ended_by(code, reason, stopped=None):
    """A contributor whose node ended as a built-in learner's does with ``code``."""
    from types import SimpleNamespace

    from dipsjax.syncer import messages as m

    spec = RunSpec(_sim(), "", (), "", "/nonexistent", (), 0, 1.0)
    c = Contributor(spec, learner=1)
    c.node = SimpleNamespace(
        run=lambda: None,
        exit_code=code,
        job_stop=None,
        proto=SimpleNamespace(exit=m.Exit(code, reason), stopped=stopped),
    )
    c._shapes = {("w",): (3,)}
    c._thread = threading.Thread(target=c._run)
    c._thread.start()
    c._thread.join()
    return c


def test_the_node_ending_reaches_the_users_calls():
    """The built-in learner's exits, as the user's loop sees them: the job's stop is
    ``done`` (a contribution then is not sent, its parameters come back); an eviction, a
    refusal or a lost link is an exception naming the reason, raised by the next call."""
    from dipsjax.runtime.contributor import (
        ContributorEvicted,
        ContributorRefused,
        ContributorUnreachable,
    )

    params = {"w": np.ones(3, np.float32)}
    c = _ended_by(0, "the job stopped: token budget reached", stopped="token budget reached")
    assert c.done and c.contribute(params, tokens=1, steps=1) is params
    for code, error in (
        (75, ContributorEvicted),
        (78, ContributorRefused),
        (69, ContributorUnreachable),
    ):
        c = _ended_by(code, "missed heartbeats")
        assert not c.done
        with pytest.raises(error, match=rf"exit {code}\): missed heartbeats") as e:
            c.pull()
        assert e.value.code == code and e.value.reason == "missed heartbeats"
        with pytest.raises(error):
            c.contribute(params, tokens=1, steps=1)
    with pytest.raises(ContributionRefused, match="missing"):  # checked before the node's end
        _ended_by(75, "x").contribute({"v": np.ones(3)}, tokens=1, steps=1)


def _members(status):
    try:
        return json.loads(status.read_text())["learners"]
    except (OSError, ValueError, KeyError):
        return {}


def _user_loop(spec, out, hook=None):
    """What a user brings: their own model, optimizer, data and loop (a hand-written optax
    AdamW over the tiny LLaMA, batches from the corpus's chunks in an order of their own),
    with the contributor wrapped around it. ``hook(contributor, n)`` runs after its
    ``n``-th contribution (a fault to inject)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from dipsjax.learner.step import cross_entropy, params_from_dict, params_to_dict
    from dipsjax.model.configs import get_config
    from dipsjax.model.llama import Llama
    from dipsjax.task import load_task

    try:
        graphdef, template = nnx.split(
            Llama(get_config(spec.sim.model), rngs=nnx.Rngs(1)), nnx.Param
        )
        # The job's inner optimizer settings, written by hand (clipped AdamW).
        tx = optax.chain(
            optax.clip_by_global_norm(1.0),
            optax.adamw(
                spec.sim.inner_lr,
                b1=spec.sim.inner_b1,
                b2=spec.sim.inner_b2,
                eps=spec.sim.inner_eps,
            ),
        )

        def loss_fn(params, batch):
            model = nnx.merge(graphdef, params_from_dict(template, params))
            return jnp.mean(cross_entropy(model(batch[:, :-1]), batch[:, 1:]))

        @jax.jit
        def step(params, opt_state, batch):
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        source = load_task(spec.sim).source
        order = [
            (c, b)
            for c in reversed(range(source.num_chunks))
            for b in range(source.batches_per_chunk)
        ]
        # Compiled before joining (as the built-in learner warms up).
        own = jax.tree.map(lambda x: np.asarray(x, np.float32), params_to_dict(template))
        jax.block_until_ready(step(own, tx.init(own), source.batch(0, 0))[2])

        status = Path(spec.run_dir) / "leader" / "status.json"
        with Contributor(spec, learner=1) as c:
            params = c.pull()
            out["initial"] = params
            opt_state = tx.init(params)
            i = 0
            while not c.done:
                losses, tokens = [], 0
                for _ in range(c.inner_steps):
                    batch = source.batch(*order[i % len(order)])
                    i += 1
                    params, opt_state, loss = step(params, opt_state, batch)
                    losses.append(float(loss))
                    tokens += batch.shape[0] * (batch.shape[1] - 1)
                # This test's user holds its first contribution until the built-in
                # learner (a process that starts and compiles more slowly than this loop)
                # has pushed once: else this loop alone could train the whole budget.
                while not _members(status).get("0", {}).get("tokens"):
                    time.sleep(0.2)
                out.setdefault("first", time.monotonic())
                before = c.version
                params = c.contribute(
                    params, tokens=tokens, steps=c.inner_steps, loss=float(np.mean(losses))
                )
                out["contributed"].append((before, tokens, c.done, c.version))
                if hook is not None:
                    hook(c, len(out["contributed"]))
            out["reported"] = c.reported
    except BaseException as e:  # the test's main thread reports it
        out["error"] = e


def _job(tmp_path, sim, hook=None):
    """A job of ``sim`` whose learner 1 is :func:`_user_loop` in this process (a thread:
    the launcher wants the main thread), learner 0 a process the launcher starts."""
    from dipsjax.launch.run import launch, make_spec

    run = tmp_path / "run"
    spec = make_spec(sim, run, heartbeat_interval=1.0)
    out = {"contributed": []}
    user = threading.Thread(target=_user_loop, args=(spec, out, hook), daemon=True)
    user.start()
    t0 = time.monotonic()
    summary = launch(spec, timeout=240, progress=False, evaluate=False, external_learners=(1,))
    user.join(60)
    assert not user.is_alive(), "the user's loop did not end on the job's stop"
    if "error" in out:
        raise out["error"]
    print(
        f"job: {time.monotonic() - t0:.1f} s (first contribution at {out['first'] - t0:.1f} s), "
        f"user rounds {out['contributed']}"
    )
    return run, spec, summary, out


def _balanced(run, summary, learners=2):
    """The token books from both sides: what each learner says the leader took (its own
    file, across its processes) is what the leader booked for it, and they add up."""
    tokens = summary["leader_tokens"]
    status = json.loads((run / "leader" / "status.json").read_text())
    for j in range(learners):
        said = json.loads((run / f"learner{j}" / "reported.json").read_text())["tokens"]
        assert said == status["learners"][str(j)]["tokens"] > 0, (j, status)
    assert (
        tokens["reported"]
        == sum(status["learners"][str(j)]["tokens"] for j in range(learners))
        == tokens["applied"] + tokens["rejected"] + tokens["dropped"]
    )
    return status


@pytest.mark.integration
@pytest.mark.slow
def test_a_users_own_loop_contributes_beside_a_built_in_learner(tmp_path):
    from dipsjax.launch.run import final_params
    from dipsjax.syncer.tape import EventTape

    # Synchronous rounds: once the user's loop has joined, every round waits for it, and
    # learner 0 alone would need all 8 pushes of the budget (under Di-PS it could push
    # most of them before the user's loop came: once, under load).
    sim = _sim(token_budget=2 * 16 * 512 * 4, method="sync_diloco")
    run, spec, summary, out = _job(tmp_path, sim)
    # The launcher started learner 0 alone (no process, no log for learner 1).
    assert set(summary["pids"]) == {"leader", "follower0", "follower1", "learner0"}
    assert not (run / "logs" / "learner1.log").exists()
    # The user's loop went on from each new version and ended on the job's stop.
    contributed = out["contributed"]
    assert len(contributed) >= 2 and contributed[-1][2]
    assert all(after > before for before, _, done, after in contributed if not done)
    # Both learners' contributions were taken into applied rounds, the user's with its own
    # counts and no chunk spans (its own data).
    tape = EventTape.read(run / "tape.jsonl")
    rounds = tape.round_records()
    accepted = [
        p
        for r in rounds
        if r.applied
        for p, ok in zip(r.participants, r.accepted, strict=True)
        if ok
    ]
    assert {p.learner for p in accepted} == {0, 1}, [
        (r.round_id, [p.learner for p in r.participants], r.accepted) for r in rounds
    ]
    mine = [p for r in rounds for p in r.participants + r.dropped if p.learner == 1]
    assert all(p.meta.spans == () and p.meta.steps == sim.inner_steps for p in mine)
    assert all(p.meta.tokens == spec.sim.inner_steps * spec.batch_tokens for p in mine)
    assert {p.learner for p in rounds[-1].participants} <= {0, 1}
    # The books balance from both sides: what each learner says the leader took is what
    # the leader booked for it; the leader's own books add up; the budget was reached.
    status = _balanced(run, summary)
    assert out["reported"] == status["learners"]["1"]["tokens"]
    sent = sum(t for _, t, _, _ in contributed)
    assert out["reported"] in (sent, sent - contributed[-1][1])  # the last one maybe unsent
    assert summary["leader_tokens"]["reported"] >= sim.token_budget
    stats = json.loads((run / "learner1" / "stats.json").read_text())
    assert stats["reported"] == out["reported"] and stats["rounds"] >= 1
    # The model moved: the final version is not the one the user first pulled.
    version, params = final_params(run)
    assert version == summary["version"] >= 2
    from dipsjax import outer

    first, last = outer.flatten(out["initial"]), outer.flatten(params)
    assert set(first) == set(last)
    assert any(not np.array_equal(first[p], last[p]) for p in first)


@pytest.mark.integration
@pytest.mark.slow
def test_the_users_loop_rejoins_a_restarted_leader_as_a_learner_process_does(tmp_path):
    """The leader is killed (SIGKILL) after the user's second contribution; the launcher
    restarts it from its snapshot, and the contributor rejoins it as the same incarnation,
    in the user's process, as the built-in learner does: the loop goes on, its later
    contributions are taken, and it ends on the job's stop."""
    import os
    import signal

    from dipsjax.syncer.tape import EventTape

    killed = {}

    def kill_leader(c, n):
        if n == 2:
            run = Path(c.spec.run_dir)
            killed["t"] = json.loads((run / "leader" / "status.json").read_text())["t"]
            os.kill(json.loads((run / "pids.json").read_text())["leader"], signal.SIGKILL)

    sim = _sim(token_budget=2 * 16 * 512 * 6)
    run, _spec, summary, out = _job(tmp_path, sim, kill_leader)
    assert out["contributed"][-1][2]  # done: the job's stop, no exception
    restarts = [json.loads(x) for x in (run / "restarts.jsonl").read_text().splitlines()]
    assert [r["role"] for r in restarts] == ["leader"], restarts  # learner 0 rejoined too
    tape = EventTape.read(run / "tape.jsonl")
    (resume,) = [r for r in tape.records if r["kind"] == "resume"]
    assert resume["t"] >= killed["t"]
    back = [r for r in tape.records if r["kind"] == "membership" and r["t"] >= resume["t"]]
    assert {r["learner"] for r in back if r["event"] == "resume"} == {0, 1}, back
    assert not [r for r in back if r["event"] in ("evict", "restart")], back
    after = [
        p
        for r in tape.round_records()
        if r.applied
        for p, ok in zip(r.participants, r.accepted, strict=True)
        if ok and p.learner == 1 and p.pushed_at > resume["t"]
    ]
    assert after and all(p.meta.incarnation == 0 for p in after)
    _balanced(run, summary)


def _task_without_data(cfg):
    """The built-in language model, whose training data must never be read here."""
    import dataclasses

    from dipsjax.tasks.lm import get_task

    def data():
        raise AssertionError("a contributor's process built the job's training data")

    return dataclasses.replace(get_task(cfg), data=data)


def test_a_contributors_node_never_builds_the_jobs_data(tmp_path, monkeypatch):
    # The user's loop reads its own data: the node in the user's process must not load the
    # job's corpus (for a large task, the whole training set in a user's notebook).
    from dipsjax.runtime import credentials
    from dipsjax.runtime.contributor import ContributorNode

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    sim = _sim(task="test_contributor:_task_without_data")
    creds = str(credentials.create(tmp_path / "creds").directory)
    spec = RunSpec(
        sim, "127.0.0.1:1", ("127.0.0.1:2",) * 2, creds, str(tmp_path / "run"), (), 0, 1.0
    )
    node = ContributorNode(Contributor(spec, learner=1), spec, 1, 0)
    assert node.source is None and node.stream is None
    assert node.task_name == "lm:tiny" and len(node.paths) > 0
    node.tb.close()
    node.control.close()
