"""The ``dipsjax`` command line: ``dipsjax {demo,goodput,...} --help``, ``dipsjax --version``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Sub-commands whose module owns its own argument parser: ``module.main(argv) -> int``.
DELEGATED = {
    "goodput": ("dipsjax.sim.goodput", "chip-scale goodput model (Decoupled DiLoCo)"),
    "simulate": ("dipsjax.sim.experiments", "run a simulator experiment (sim_* configs)"),
    "plan": ("dipsjax.model.plan", "parameter count and memory plan of every named model"),
    "run": ("dipsjax.launch.run", "leader, followers and learners as processes on this machine"),
    "credentials": ("dipsjax.runtime.credentials", "create a run's TLS certificates and job token"),
    "snapshot": ("dipsjax.runtime.snapshot", "consistent snapshot of a running job, to resume"),
    "status": ("dipsjax.runtime.status", "live view of a running job, from its leader"),
    "timeline": ("dipsjax.runtime.timeline", "draw a run's event tape as a timeline PNG"),
    "export": ("dipsjax.export", "a run's parameters as orbax and safetensors, for its model"),
}


def _demo(args: argparse.Namespace) -> int:
    from dipsjax import demo

    demo.run(rounds=args.rounds, learners=args.learners, seed=args.seed)
    return 0


def version() -> str:
    """The installed distribution's version (``importlib.metadata``), else the package's
    ``__version__`` (running from a source tree that is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("dipsjax")
    except metadata.PackageNotFoundError:
        from dipsjax import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dipsjax", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="outer-optimizer demonstration on a toy problem")
    demo.add_argument("--rounds", type=int, default=30)
    demo.add_argument("--learners", type=int, default=4)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    for name, (_, help_text) in DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        from dipsjax.data.fetch import CorpusError

        try:
            module = importlib.import_module(DELEGATED[argv[0]][0])
            return module.main(argv[1:])
        except CorpusError as e:  # what to run to get the corpus, and where it is looked for
            print(f"dipsjax {argv[0]}: {e}", file=sys.stderr)
            return 1
        except ModuleNotFoundError as e:  # an install without the extras (pip install dipsjax)
            if e.name is None or e.name.split(".")[0] == "dipsjax":
                raise
            print(
                f"dipsjax {argv[0]}: needs the Python package {e.name!r}, one of the 'run' "
                "extra's dependencies: pip install 'dipsjax[run]'",
                file=sys.stderr,
            )
            return 1
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
