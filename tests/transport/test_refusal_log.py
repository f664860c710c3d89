"""issue 18 item 7: refusals are counted exactly and logged at most once per kind per
interval."""

from dipsjax.transport.refusals import RefusalLog


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_counts_are_exact_and_lines_bounded_per_kind_and_interval():
    clock, lines = Clock(), []
    log = RefusalLog(interval=10.0, emit=lines.append, clock=clock)
    logged = [log.record("tls", f"handshake {i} refused") for i in range(1000)]
    logged += [log.record("cap", "over the caps") for _ in range(5)]
    assert sum(logged) == 2 and len(lines) == 2  # the first of each kind
    assert log.counts == {"tls": 1000, "cap": 5}
    clock.t = 10.0
    assert log.record("tls", "handshake refused") is True
    assert len(lines) == 3 and "1000 since" in lines[-1]  # 999 held back + this one
    assert log.record("tls", "again") is False and log.counts["tls"] == 1002
    summary = log.summary()
    assert "tls: 1002" in summary and "cap: 5" in summary
