"""``snapshot.take`` never copies a leader snapshot taken while a decided round is being
carried out: the followers hold that round's inputs in memory only, so fresh processes
could not redo it (the CI rehearsal's resumed job stopped on "follower 1 came back at
version 6 without the inputs of round 6")."""

import json
import threading
import time

from dipsjax.runtime import snapshot
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig
from dipsjax.syncer.tape import TokenLedger


def _leader_state(version, decided):
    rnd = {"round_id": version, "phase": "apply", "decision": {"round_id": version}}
    return {
        "version": version,
        "round": rnd if decided else None,
        "tape_records": 1,
        "incarnations": [[0, 0]],
        "ledger": TokenLedger().to_json(),
    }


def test_a_snapshot_waits_for_the_decided_round_to_end(tmp_path):
    run = tmp_path / "run"
    spec = RunSpec(
        SimConfig(learners=1, followers=1), "127.0.0.1:1", ("127.0.0.1:2",), "", str(run), (0,), 1
    )
    (run / "leader").mkdir(parents=True)
    spec.write(run / "spec.json")
    (run / "tape.jsonl").write_text('{"kind": "x"}\n')
    for v in (6, 7):
        (run / "follower0" / "ckpt" / str(v)).mkdir(parents=True)
    snap = run / "leader" / "snapshot.json"
    snap.write_text(json.dumps(_leader_state(6, decided=True)))

    def round_ends():
        time.sleep(0.5)
        snap.write_text(json.dumps(_leader_state(7, decided=False)))

    t = threading.Thread(target=round_ends)
    t.start()
    taken = snapshot.take(run, tmp_path / "snap")
    t.join()
    assert taken["version"] == 7  # not 6, whose round 6 was being applied
    assert json.loads((tmp_path / "snap" / "leader" / "snapshot.json").read_text())["round"] is None
