"""Time the goodput Monte-Carlo at 1.2M chips over 30 simulated days (goal: < 10 s).

Run: ``.venv/bin/python benchmarks/goodput.py``. Each method of ``DEFAULT_METHODS``
(checkpoint/restart DP, elastic DP, Decoupled DiLoCo M = 8 and 16) is timed end to end
(drawing the interruptions, accounting, closed form); the reported figure is the slowest
method's best of three runs.
"""

from __future__ import annotations

import time

from dipsjax.sim import goodput as gp


def main() -> None:
    slowest = 0.0
    for label in gp.DEFAULT_METHODS:
        method, learners = gp.parse_method(label)
        params = gp.GoodputParams(
            chips=1_200_000, method=method, learners=learners, horizon_days=30.0
        )
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            result = gp.goodput(params)
            best = min(best, time.perf_counter() - start)
        slowest = max(slowest, best)
        print(
            f"{label:>14}: {result.percent:6.2f} % (closed form {result.analytic_percent:6.2f} %), "
            f"{result.interruptions} interruptions, {best:.3f} s"
        )
    print(f"goodput_1p2m_30d_seconds: {slowest:.3f} (goal: < 10)")


if __name__ == "__main__":
    main()
