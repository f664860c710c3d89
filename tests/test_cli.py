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


def test_version_is_the_installed_distribution_s(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"dipsjax {metadata.version('dipsjax')}"


def test_version_falls_back_to_the_package_s_when_not_installed(monkeypatch):
    from importlib import metadata

    import dipsjax

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert cli.version() == dipsjax.__version__


def test_a_missing_dependency_of_the_run_extra_is_named(monkeypatch, capsys):
    def no_grpc(name):
        raise ModuleNotFoundError("No module named 'grpc'", name="grpc")

    monkeypatch.setattr(cli.importlib, "import_module", no_grpc)
    assert cli.main(["status", "runs/x"]) == 1
    assert "'grpc'" in (err := capsys.readouterr().err) and "dipsjax[run]" in err


def test_dipsjax_run_has_no_time_limit_unless_given_one(monkeypatch, tmp_path):
    import inspect

    from dipsjax.launch import run

    assert inspect.signature(run.launch).parameters["timeout"].default is None
    seen = []
    monkeypatch.setattr(run, "_run_to_the_end", lambda spec, **kw: seen.append(kw) or 0)
    monkeypatch.chdir(tmp_path)  # the run folder: ./runs/NAME-TIME of the current folder
    assert run.main(["quickstart", "--arg", "ci"]) == 0
    assert run.main(["quickstart", "--arg", "ci", "--timeout", "90"]) == 0
    assert [kw["timeout"] for kw in seen] == [None, 90.0]
    assert list((tmp_path / "runs").glob("quickstart-*/credentials"))


def test_a_missing_corpus_says_how_to_get_it_without_a_traceback(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DIPSJAX_DATA", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "quickstart", "--arg", "ci"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dipsjax run: corpus not usable") and "dipsjax.data.fetch" in err
