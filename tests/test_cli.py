"""The `dipsjax` command routes to each tool's own parser."""

import json

import pytest

from dipsjax import cli


def test_goodput_json_through_the_dipsjax_command(capsys):
    assert cli.main(["goodput", "--chips", "1.2M", "--learners", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    dp = out["elastic_dp"]["1200000"]
    m8 = out["decoupled_m8"]["1200000"]
    assert abs(dp - 58) <= 3 and abs(m8 - 88) <= 3


def test_plan_lists_every_named_config(capsys):
    assert cli.main(["plan"]) == 0
    text = capsys.readouterr().out
    for name in ("tiny", "small", "llama3.2-1b", "qwen3-14b", "dips-100b"):
        assert name in text


def test_unknown_command_is_an_error():
    with pytest.raises(SystemExit):
        cli.main(["teleport"])
