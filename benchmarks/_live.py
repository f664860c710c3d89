"""What the live-job benchmarks (``chaos.py``, ``hostile.py``) share: a Di-PS job of 3
learners (speeds 1, 1.3, 1.6) and 2 followers started as processes by the local launcher,
and its files read while it runs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LAUNCH = (
    "import sys; from dipsjax.launch.run import launch; from dipsjax.runtime.spec import "
    "RunSpec; launch(RunSpec.read(sys.argv[1]), progress=False, evaluate=False)"
)
LEARNERS, FOLLOWERS = 3, 2


def read_json(path: Path) -> Any:
    """``path``'s JSON, or None while it is missing or half-written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class LiveJob:
    """A Di-PS job of :data:`LEARNERS` learners (speeds 1, 1.3, 1.6) and :data:`FOLLOWERS`
    followers in ``folder / "run"`` (its ``SimConfig`` changed by ``sim_changes``), its
    budget ``pushes`` full rounds, its spec changed by
    ``spec_changes`` (e.g. ``max_restarts``) and written to ``folder / "spec.json"``, its
    launcher started (``standby``: with a standby leader); and what its files say while it
    runs."""

    def __init__(
        self,
        folder: Path,
        pushes: int,
        inner_steps: int,
        standby: bool = False,
        sim_changes: dict[str, Any] | None = None,
        **spec_changes: Any,
    ):
        from dipsjax.launch.run import make_spec
        from dipsjax.sim.config import SimConfig

        sim = SimConfig(
            method="dips",
            learners=LEARNERS,
            followers=FOLLOWERS,
            inner_steps=inner_steps,
            speeds=(1, 1.3, 1.6),
            **(sim_changes or {}),
        )
        self.sim = dataclasses.replace(sim, token_budget=sim.full_round_tokens * pushes)
        folder.mkdir(parents=True, exist_ok=True)
        self.run = folder / "run"
        spec = make_spec(self.sim, self.run, standby_leader=standby)
        self.spec = dataclasses.replace(spec, **spec_changes)
        path = folder / "spec.json"
        self.spec.write(path)
        self.launcher = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, str(path)], stdout=subprocess.DEVNULL
        )

    def status(self) -> dict | None:
        return read_json(self.run / "leader" / "status.json")

    def pids(self) -> dict[str, int]:
        return read_json(self.run / "pids.json") or {}

    def wait(self, cond, seconds: float) -> bool:
        """Whether ``cond()`` came true within ``seconds`` while the job ran."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.launcher.poll() is None:
            if cond():
                return True
            time.sleep(0.02)
        return False
