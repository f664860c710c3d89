"""`dipsjax demo`: the Di-PS chain rejects the faulty learner and the toy model converges."""

import io

from rich.console import Console

from dipsjax import cli, demo


def test_demo_rejects_faulty_and_converges():
    out = io.StringIO()
    result = demo.run(rounds=30, learners=4, seed=0, console=Console(file=out, width=120))
    assert result["sent_faulty"] >= 2
    assert result["rejected_faulty"] == result["sent_faulty"]
    assert result["rejected_healthy"] == 0
    assert result["final_loss"] < 0.02  # from ~13 at the start
    assert "faulty contributions rejected" in out.getvalue()


def test_cli_parses_demo_arguments():
    args = cli.build_parser().parse_args(["demo", "--rounds", "3", "--learners", "2"])
    assert (args.command, args.rounds, args.learners) == ("demo", 3, 2)
