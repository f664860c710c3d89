"""Launches a dipsjax run: ``python launch/dips.py --config quickstart
--executor local|slurm|kubernetes [--arg ci] [--set FIELD=VALUE ...]``.

A thin script over the launch API (:mod:`dipsjax.launch`): the same as ``dipsjax run
CONFIG --executor ...``. ``local`` runs the leader, followers and learners as processes
here; ``slurm`` submits one heterogeneous job (a job step per role; ``--wait`` waits for
it); ``kubernetes`` writes a JobSet manifest, validated offline, for ``kubectl apply``.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dipsjax.launch.run import main


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", default="quickstart")
    known, rest = parser.parse_known_args(argv)
    return main([known.config, *rest])


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
