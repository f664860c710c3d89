"""``dipsjax status RUN_DIR``: a live view of a running job, read from its leader through
the authenticated control plane (mutual TLS and the job token, from the run's
``spec.json`` and credentials).

It shows the version and rounds, the round in progress (its pushes and when its grace
window closes), the phase times of the last round (grace, push, update, pull, as the
paper's production table), the members (state, incarnation, tokens, accepted pushes),
the followers up, the token books against the budget, the throughput, and the refusals
by kind; from the run folder, each learner's phase (``compiling``, ``training``...: its
``phase.json``) and the newest validation points (``validation``: the evaluator's
``eval.jsonl``, while the run trains). It refreshes every ``--every`` seconds until the
job stops (or Ctrl-C); ``--once`` prints one view, ``--json`` the leader's raw status (with
``validation`` and ``phases``).

Run: ``dipsjax status runs/quickstart-TIME [--every 1] [--once] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from dipsjax.runtime.spec import RunSpec


class StatusError(RuntimeError):
    """The leader could not be asked (not running, another job's credentials...)."""


def read(run_dir: str | Path, timeout: float = 5.0) -> dict[str, Any]:
    """The leader's status of the job in ``run_dir`` (raises :class:`StatusError`)."""
    from dipsjax.runtime.client import ControlClient

    path = Path(run_dir) / "spec.json"
    if not path.exists():
        raise StatusError(f"no spec.json in {run_dir}: not a dipsjax run folder")
    spec = RunSpec.read(path)
    try:
        client = ControlClient(spec)
    except (OSError, ValueError) as e:  # credentials missing, short, or loose
        raise StatusError(str(e)) from None
    try:
        return with_run_files(client.status(timeout=timeout), run_dir, spec.sim.learners)
    except grpc.RpcError as e:
        code = e.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            why = "the leader refused the job credential (another job's token?)"
        elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            why = (
                f"no leader answered at {' or '.join(spec.leaders)} within {timeout:.0f} s "
                "(the job has ended, or its credentials are not this leader's)"
            )
        else:
            why = f"{code.name}: {e.details()}"
        raise StatusError(why) from None
    finally:
        client.close()


def with_run_files(st: dict[str, Any], run_dir: str | Path, learners: int) -> dict[str, Any]:
    """The leader's status with what the run folder says besides: ``validation`` (the
    evaluator's newest points, oldest first, at most 5), ``phases`` (each learner's
    phase file, by learner) and, with a standby leader, ``lease`` (the active leader's
    lease: its epoch, holder, address, and ``age``, seconds since it was last renewed)."""
    from dipsjax.runtime import lease, progress

    doc = lease.read_lease(run_dir)
    if doc is not None:
        st["lease"] = {**doc, "age": max(time.time() - doc["t"], 0.0)}

    st["validation"] = progress.read_validation(run_dir)[-5:]
    st["phases"] = {
        str(j): p.get("phase") for j, p in progress.read_phases(run_dir, learners).items()
    }
    return st


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def render(st: dict[str, Any]) -> Any:
    """A rich renderable of one status."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from dipsjax.runtime import progress

    books = st["tokens"]
    outstanding = books["reported"] - books["applied"] - books["rejected"] - books["dropped"]
    budget = st.get("budget")
    done = f" of {budget} ({100 * books['reported'] / budget:.0f}%)" if budget else ""
    head = Text.assemble(
        (f"version {st['version']}", "bold"),
        f"   rounds {st['rounds']}   phase {st['phase']}   t {st['t']:.1f} s",
        "   STOPPED" if st.get("stopped") else "",
    )
    lines = [
        head,
        Text(
            f"tokens reported {books['reported']}{done}: applied {books['applied']}, "
            f"rejected {books['rejected']}, dropped {books['dropped']}, "
            f"in flight {outstanding};  "
            f"{st.get('tokens_per_s', 0.0):.0f} tokens/s reported"
        ),
        Text(f"followers up {st['followers_up']}"),
    ]
    who = st.get("leader")
    if who:
        text = f"leader: epoch {who['epoch']} at {who['address']} ({who['holder']})"
        if who.get("standby"):
            other = who["standby"] if who["address"] != who["standby"] else "the leader's"
            text += f"; standby address {other}"
        held = st.get("lease")
        if held and held.get("epoch") == who["epoch"]:
            text += f"; lease renewed {held['age']:.1f} s ago"
        lines.append(Text(text))
    rnd = st.get("round")
    if rnd:
        closes = rnd.get("grace_closes_in")
        window = "" if closes is None else f", grace window closes in {closes:.2f} s"
        lines.append(
            Text(
                f"round {rnd['id']} ({rnd['phase']}): pushes from {rnd['pushes']}"
                f"{window} (window {_seconds(rnd.get('grace'))})"
            )
        )
    last = st.get("last_round")
    if last:
        ph = last["phases"]
        lines.append(
            Text(
                f"last round {last['id']} ({'applied' if last['applied'] else 'not applied'}, "
                f"{last['participants']} pushes): grace {_seconds(ph['grace'])}, push "
                f"{_seconds(ph['push'])}, update {_seconds(ph['update'])}, pull "
                f"{_seconds(ph['pull'])}"
            )
        )
    for p in st.get("validation", [])[-1:]:
        tokens = "" if p.get("tokens") is None else f", {p['tokens']} tokens applied"
        bpb = p.get("val_bpb")  # NaN for a task that is not a language model
        bpb = f", val_bpb {bpb:.3f}" if isinstance(bpb, int | float) and math.isfinite(bpb) else ""
        bpb += "".join(f", {k} {v:.4f}" for k, v in progress.other_figures(p).items())
        lines.append(
            Text(
                f"validation: val_loss {p['val_loss']:.4f}{bpb} at version {p['version']}{tokens} "
                f"({len(st['validation'])} recent points)",
                style="green",
            )
        )
    if st.get("refused"):
        said = ", ".join(f"{k} {n}" for k, n in st["refused"].items())
        lines.append(Text(f"refused: {said}", style="yellow"))
    table = Table("learner", "state", "phase", "incarnation", "tokens", "accepted")
    phases = st.get("phases", {})
    for j in sorted({*st["learners"], *phases}, key=int):
        m = st["learners"].get(j)
        if m is None:  # not a member yet (compiling): its phase file alone
            table.add_row(j, "-", str(phases[j]), "-", "-", "-")
            continue
        table.add_row(
            j,
            m["state"],
            str(phases.get(j, "-")),
            str(m["incarnation"]),
            str(m["tokens"]),
            str(m["accepted"]),
        )
    return Group(*lines, table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dipsjax status", description=__doc__)
    parser.add_argument("run_dir", help="the run folder (holds spec.json)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between refreshes")
    parser.add_argument("--once", action="store_true", help="print one view and exit")
    parser.add_argument("--json", action="store_true", help="print the raw status once")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for it")
    parser.add_argument(
        "--patience",
        type=float,
        default=60.0,
        help="live view: seconds without an answer (a leader restarting) before giving up",
    )
    args = parser.parse_args(argv)
    if args.every <= 0:
        parser.error(f"--every must be > 0 seconds, got {args.every}")
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    console = Console()
    try:
        st = read(args.run_dir, args.timeout)
        if args.json:
            print(json.dumps(st, indent=1))
            return 0
        if args.once:
            console.print(render(st))
            return 0
        with Live(render(st), console=console, auto_refresh=False) as live:
            heard = time.monotonic()
            while not st.get("stopped"):
                time.sleep(args.every)
                try:
                    st = read(args.run_dir, args.timeout)
                    heard = time.monotonic()
                except StatusError as e:  # a leader restarting: keep the view, try again
                    if time.monotonic() - heard > args.patience:
                        raise
                    live.update(Group(render(st), Text(f"(not answering: {e})", "red")))
                    live.refresh()
                    continue
                live.update(render(st), refresh=True)
    except StatusError as e:
        print(f"dipsjax status: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
