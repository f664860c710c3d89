"""The runtime with real processes: a leader, 2 followers and 2 learners over gRPC and TCP."""

import collections
import itertools
import json
import math
import os
from pathlib import Path

import pytest

from dipsjax.launch.run import final_params, launch, make_spec
from dipsjax.runtime.tbread import run_scalars
from dipsjax.sim.config import SimConfig
from dipsjax.sim.replay import replay, tree_equal

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _alive(pids):
    alive = []
    for name, pid in pids.items():
        try:
            os.kill(pid, 0)
            alive.append(name)
        except ProcessLookupError:
            pass
    return alive


@pytest.mark.parametrize(
    "method,extra",
    [
        # Adaptive steps (EXTENSION): learner 0, 1.5 times as fast, is told to train about
        # 24 steps a round; the processes carry the count from the leader's word to the push.
        ("dips", {"adaptive_steps": True}),
        # deal_chunks: its quorum is all M learners from the first round (as the simulator
        # runs it), so a learner whose process starts late on a loaded machine is waited for
        # rather than left out of every round (a CI rehearsal saw learner 1 join after the
        # budget was spent: reported 0).
        ("sync_diloco", {"deal_chunks": True}),
        ("decoupled", {"quorum": 1, "overlap": True, "adopt": "delta"}),
    ],
    ids=["dips", "sync_diloco", "decoupled_overlap"],
)
def test_processes_train_to_the_budget_and_the_tape_replays_bit_for_bit(
    tmp_path, method, extra, monkeypatch, capsys
):
    from dipsjax.launch import run

    monkeypatch.setattr(run, "PROGRESS_EVERY", 1.0)  # the console's lines, every second
    # Di-PS waits for nobody: a CI rehearsal saw learner 0's process finish compiling 5 s
    # after learner 1's, which spent a 3-round budget (6 rounds of its own in 5 s) alone
    # (learner 0 reported 0). Its budget is twice as long, so both take part.
    rounds = 6 if method == "dips" else 3
    sim = SimConfig(
        method=method,
        learners=2,
        followers=2,
        token_budget=2 * 16 * 512 * rounds,
        speeds=(1.0, 1.5),
        **extra,
    )
    spec = make_spec(sim, tmp_path / "run", heartbeat_interval=1.0)
    summary = launch(spec, timeout=400)
    console = capsys.readouterr().out
    # The leader stopped at its budget (pushes still waiting then were dropped, not merged).
    tokens = summary["leader_tokens"]
    assert tokens["reported"] >= sim.token_budget and summary["applied"] >= 2
    assert summary["tokens"] == tokens["applied"] + tokens["rejected"]
    assert len(summary["pids"]) == 5 and _alive(summary["pids"]) == []  # nothing left running
    # Every learner ended on the job's Stop, even one still training when the leader went
    # (not killed while it waited for a leader that had stopped), and wrote its stats.
    for j in range(2):
        log = (tmp_path / "run" / "logs" / f"learner{j}.log").read_text()
        assert "stopped (the job stopped" in log and "control plane lost" not in log, log[-2000:]
        stats = json.loads((tmp_path / "run" / f"learner{j}" / "stats.json").read_text())
        # Each learner's push reached the leader. (Not "a round completed": under Decoupled
        # DiLoCo, K=1, the fast learner can spend the budget while the slow one, compiled
        # later, has its first push in flight: the CI rehearsal saw rounds 0, reported 8192.)
        assert stats["reported"] >= sim.inner_steps * sim.batch_size * sim.seq_len
    version, params = final_params(tmp_path / "run")  # every follower at one version
    assert version == summary["version"]
    # The same core and numerics as the simulator: its replay recomputes the run exactly.
    from dipsjax.syncer.tape import EventTape

    tape = EventTape.read(tmp_path / "run" / "tape.jsonl")
    assert tree_equal(replay(sim, tape), params)
    # The run ended by drawing its timeline.
    assert (tmp_path / "run" / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Every role wrote TensorBoard scalars, and they count what the tape counts.
    tb = run_scalars(tmp_path / "run")
    assert set(tb) == {"leader", "follower0", "follower1", "learner0", "learner1", "eval"}
    rounds = [r for r in tape.round_records() if r.participants]
    assert [int(v) for _, v in tb["leader"]["round/participants"]] == [
        len(r.participants) for r in rounds
    ]
    for k in range(2):  # each follower logged one outer step per version the tape applied
        assert len(tb[f"follower{k}"]["follower/apply_s"]) == summary["version"]
    for j in range(2):  # each learner logged every round it trained (at least those it pushed)
        pushed = sum(p.learner == j for r in rounds for p in r.participants)
        losses = [v for _, v in tb[f"learner{j}"]["learner/train_loss"]]
        assert len(losses) >= pushed and all(0 < v < 10 for v in losses)
    # Every follower applied the same accepted set, weights and clip factor: the tape's.
    logs = [
        [
            json.loads(line)
            for line in (tmp_path / "run" / f"follower{k}" / "decisions.jsonl")
            .read_text()
            .splitlines()
        ]
        for k in range(2)
    ]
    assert logs[0] == logs[1] and len(logs[0]) == summary["applied"]
    applied = [r for r in tape.round_records() if r.applied]
    for rec, d in zip(applied, logs[0], strict=True):
        assert (d["accepted"], d["weights"], d["clip_factor"]) == (
            rec.accepted,
            rec.weights,
            rec.clip_factor if rec.clip_factor is not None else 1.0,
        )
    if sim.adaptive_steps:  # the fast learner trained more steps than H, as it was told
        steps = [(p.learner, p.meta.steps) for r in tape.round_records() for p in r.participants]
        assert any(j == 0 and n > sim.inner_steps for j, n in steps), steps
        assert all(n <= 2 * sim.inner_steps for _, n in steps), steps
    if sim.overlap:  # learners trained on while their pushes were in flight
        assert any(not p.meta.pulled for r in tape.round_records() for p in r.participants)
    _assert_no_secret_outside_the_credentials(spec)
    _assert_private(spec, version)
    _assert_watched(spec, console, version)


def _assert_watched(spec, console, version):
    """Issue 19: every role's log has its main events, each line with its time, level and
    role; the console showed the learners compiling, then training; the evaluator ran
    beside the roles, and ended with them."""
    import re

    from dipsjax.runtime import logs, progress

    run_dir = Path(spec.run_dir)
    line = re.compile(logs.LINE)
    expected = {
        "leader": [r"listening on 127\.0\.0\.1:\d+", r"round \d+ applied: version \d+, \d+ tokens"],
        "follower0": [r"serving the data plane on", r"applied round \d+: version \d+"],
        "learner0": [r"compiling: task lm:tiny", r"compiled in", r"trained \d+ steps .* grad norm"],
        "evaluator": [r"watching .* for versions"],
    }
    expected["leader"].append(r"the job stopped \(token budget")
    expected["follower0"].append(r"stopped at version \d+")
    expected["learner0"].append(r"stopped \(the job stopped")
    for role, events in expected.items():
        text = (run_dir / "logs" / f"{role}.log").read_text()
        ours = [x for x in text.splitlines() if re.search(r" (DEBUG|INFO|WARNING|ERROR) ", x)]
        assert ours and all(line.match(x) for x in ours), (role, text[-2000:])
        assert all(f" {role}: " in x for x in ours if line.match(x)), role
        for event in events:
            assert any(re.search(line.pattern + event, x) for x in ours), (role, event, text)
    # The console: each learner's phase, compiling first, then training.
    lines = [x.split(" | ")[1] for x in console.splitlines() if " | learners: " in x]
    compiling = [i for i, x in enumerate(lines) if " compiling" in x]
    # After compiling, the protocol's phases. Which of them a line shows depends on when
    # the console sampled (a tiny round trains in less than its second), so any of them
    # counts; that the learners trained is in their logs, checked above.
    protocol = progress.PHASES[progress.PHASES.index("joining") : progress.PHASES.index("exited")]
    shown = [set(re.findall(r"\d+ ([a-z ]+?)(?:,|$)", x.removeprefix("learners: "))) for x in lines]
    later = [i for i, names in enumerate(shown) if names & set(protocol)]
    assert compiling and later and compiling[0] < later[-1], console[-3000:]
    assert progress.read_phases(run_dir, spec.sim.learners)[0]["phase"] == "exited"
    # The evaluator (at the lowest CPU priority) reported the initialization (or, had it
    # no CPU until a version was saved, that version), then what versions it could as they
    # were saved: finite, while the job ran (before the end-of-run timeline was drawn).
    points = progress.read_validation(run_dir)
    ended = (run_dir / "timeline.png").stat().st_mtime
    assert points, (run_dir / "logs" / "evaluator.log").read_text()
    for p in points:  # the versions saved every eval_every, and the last one
        assert p["version"] % spec.sim.eval_every == 0 or p["version"] == version
        assert math.isfinite(p["val_loss"]) and p["val_bpb"] > 0 and p["time"] < ended
    assert points[-1]["version"] == version


def _assert_private(spec, version):
    """Every file and folder of the run (model, orbax shards, tape, logs, TensorBoard) is
    its owner's alone: no group or other bit (issue 18 item 2; before, 0644 in 0755)."""
    import stat

    entries = [Path(spec.run_dir), *Path(spec.run_dir).rglob("*")]
    open_to_others = [
        f"{p} {stat.S_IMODE(p.stat().st_mode):04o}"
        for p in entries
        if stat.S_IMODE(p.stat().st_mode) & 0o077
    ]
    assert open_to_others == []
    names = [p.name for p in entries]
    # What was walked: the model, a version (where the run reached one to evaluate), the
    # tape, logs, TensorBoard, orbax's files.
    assert "final.npz" in names
    if version >= spec.sim.eval_every:
        assert any(n.startswith("v") and n.endswith(".npz") for n in names)
    assert "tape.jsonl" in names and any(n.endswith(".log") for n in names)
    assert any(n.startswith("events.out.tfevents") for n in names)
    assert "_METADATA" in names  # an orbax checkpoint (the learners')


def _assert_no_secret_outside_the_credentials(spec):
    """No file the run wrote (logs, tapes, checkpoints, spec, tensorboard) holds the job
    token or the key; only ``spec.credentials`` does."""
    creds = Path(spec.credentials)
    secrets = [spec.token.encode(), (creds / "key.pem").read_bytes().splitlines()[1]]
    files = [p for p in Path(spec.run_dir).rglob("*") if p.is_file() and creds not in p.parents]
    assert len(files) > 20 and any(p.name == "tape.jsonl" for p in files)
    for p in files:
        data = p.read_bytes()
        for secret in secrets:
            assert secret not in data, f"{p} holds a secret"


def test_ctrl_c_stops_every_process_within_seconds(tmp_path):
    import json
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dipsjax.cli", "run", "--arg", "ci", "--out", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # wait until the learners have joined
        status = run / "leader" / "status.json"
        if status.exists():
            try:
                if json.loads(status.read_text())["members"]:
                    break
            except ValueError:
                pass
        time.sleep(0.5)
    else:
        launcher.kill()
        pytest.fail("the run never started")
    pids = json.loads((run / "pids.json").read_text())
    t0 = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    out, _ = launcher.communicate(timeout=30)
    assert time.monotonic() - t0 < 15, out
    assert launcher.returncode == 130 and "every process was ended" in out
    assert _alive(pids) == []


def test_a_late_learner_pulls_first_and_pushes_during_an_update_join_the_next_round(tmp_path):
    """Also a stale upsize (seed 003): the late learner's links are slow while it joins (a fault
    injection of 60 kB/s on each follower's connection), so its first pull takes seconds;
    the others go on applying versions meanwhile, and it starts from the version it was
    sent, stale by then, without blocking anyone.

    Its learners push in the 2-bit ``stat2`` codec with error feedback (EXTENSION): each
    push is settled by the outcome the leader's ``NotifyPull`` says, as the tape has it
    (stale pushes among them), and the residuals stay finite."""
    import dataclasses

    from dipsjax.syncer.tape import EventTape

    sim = SimConfig(
        method="dips",
        learners=3,
        followers=2,
        token_budget=3 * 16 * 512 * 10,
        speeds=(1.0, 1.3, 1.7),
        joins=((2, 6.0),),  # learner 2 joins 6 s after training began
        wire="stat2",
        error_feedback=True,
    )
    # Slow updates (each follower waits 0.7 s before applying) so that pushes land in them.
    spec = dataclasses.replace(
        make_spec(sim, tmp_path / "run", 1.0), apply_delay=0.7, link_rates=((2, 60e3),)
    )
    summary = launch(spec, timeout=400, progress=False, evaluate=False)
    tape = EventTape.read(tmp_path / "run" / "tape.jsonl")
    rounds = tape.round_records()
    assert summary["leader_tokens"]["reported"] >= sim.token_budget
    # The late learner joined after versions were applied, pulled the version it was sent
    # (one complete model, checked by the learner to be one version across followers) and
    # only then pushed, from that version.
    events = [r for r in tape.records if r["kind"] == "membership" and r["learner"] == 2]
    join = next(r for r in events if r["event"] == "join")
    active = next(r for r in events if r["event"] == "active")
    assert join["version"] >= 1 and active["pulled_version"] == join["version"], events
    mine = [p for r in rounds for p in r.participants + r.dropped if p.learner == 2]
    first = min(mine, key=lambda p: p.pushed_at)
    assert first.pushed_at > active["t"]
    assert first.meta.pulled and first.meta.base_version == active["pulled_version"]
    # Stale upsize: while its pull ran (527 kB of FP32, half from each follower at 60 kB/s:
    # about 4.4 s), the others' rounds went on (versions applied between its join and its
    # first push). Its first push, from the stale version, was taken into a round if Di-PS
    # could rebuild it from the followers' version cache, else dropped as too stale (both
    # happen here: some 2 to 8 versions go by, and 8 is past the bound).
    applied_meanwhile = [
        r for r in rounds if r.applied and join["t"] < r.timings["ended"] < active["t"]
    ]
    assert applied_meanwhile, [(r.version, r.timings["ended"]) for r in rounds]
    context = (first, [(r.round_id, r.version, r.applied) for r in rounds])
    taken = [r for r in rounds if any(p is first for p in r.participants)]
    dropped = [r for r in rounds if any(p is first for p in r.dropped)]
    assert first.staleness >= 1, context
    if first.staleness <= sim.version_cache - 1:  # the leader's stale limit for Di-PS
        assert len(taken) == 1 and not dropped, context
    else:
        assert len(dropped) == 1 and not taken, context
    # The sender of each push dropped as stale was told so (``Unused``), as the learners
    # count it themselves.
    for j in range(sim.learners):
        stats = json.loads((tmp_path / "run" / f"learner{j}" / "stats.json").read_text())
        stale = sum(p.learner == j for r in rounds for p in r.dropped)
        assert stats["unused"].get("stale", 0) == stale, (j, stats, context)
    # It contributed: its pushes went into applied rounds (the anomaly penalty judges them).
    assert any(p.learner == 2 for r in rounds if r.applied for p in r.participants), [
        (r.round_id, [p.learner for p in r.participants]) for r in rounds
    ]
    # A push that arrived while a round was being updated or pulled went into a later round,
    # opened after that one ended (no push joins a round once its update started).
    during = [
        (r, later, p)
        for r in rounds
        if r.timings.get("transfers_done") is not None
        for later in rounds
        for p in later.participants + later.dropped
        if r.timings["transfers_done"] < p.pushed_at < r.timings["ended"]
    ]
    assert during, "no push landed during an update or a pull"
    for r, later, _ in during:
        assert later.round_id > r.round_id and later.timings["opened"] >= r.timings["ended"]
    # Error feedback: every push the leader answered was settled by the outcome the tape
    # gives it (the last one may have had no answer: the job stopped), none lost.
    for j in range(sim.learners):
        stats = json.loads((tmp_path / "run" / f"learner{j}" / "stats.json").read_text())
        fb = stats["feedback"]
        tape_says = collections.Counter()
        for r in rounds:
            tape_says["stale"] += sum(p.learner == j for p in r.dropped)
            for p, ok in itertools.zip_longest(r.participants, r.accepted):
                if p.learner == j:
                    said = "rejected" if ok is False else "applied" if r.applied else "discarded"
                    tape_says[said] += 1
        settled = collections.Counter(fb["settled"])
        assert set(settled) <= {"applied", "rejected", "stale", "discarded", "nonfinite"}
        assert all(settled[o] <= tape_says[o] for o in settled), (j, fb, tape_says)
        assert sum(settled.values()) >= sum(tape_says.values()) - 1, (j, fb, tape_says)
        assert settled["applied"] >= 1 and 0 < fb["residual_norm"] < math.inf, (j, fb)
