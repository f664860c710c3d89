"""The configs that ship with dipsjax: one ``NAME.py`` a config, with ``get_config(arg)``
returning an ``ml_collections.ConfigDict`` (see ``README.md`` here).

``dipsjax run NAME`` and ``dipsjax simulate NAME`` find them by name (:func:`path`); a
path to a ``.py`` file of your own is loaded the same way. The shared modules
(``_sim_common``, ``_paper_scale``) are imported as ``dipsjax.configs._sim_common``, so a
copy of a config works from any folder.
"""

from __future__ import annotations

from pathlib import Path

#: The folder of the shipped configs (inside the installed package).
DIR = Path(__file__).resolve().parent


def names(prefix: str = "") -> list[str]:
    """The shipped configs' names (those starting with ``prefix``), sorted."""
    return sorted(p.stem for p in DIR.glob(f"{prefix}*.py") if not p.stem.startswith("_"))


def path(name_or_path: str) -> Path:
    """The file of a config: a shipped config's ``NAME`` (no suffix: ``quickstart``,
    ``sim_eta``), else a path to a ``.py`` file (``my_run.py``, ``/abs/cfg.py``).
    :class:`FileNotFoundError` names the shipped configs when neither exists."""
    given = Path(name_or_path)
    candidate = given if given.suffix else DIR / f"{name_or_path}.py"
    if candidate.is_file():
        return candidate
    what = "file" if given.suffix else "shipped config"
    raise FileNotFoundError(
        f"no config {name_or_path!r} (no such {what}); shipped configs, known by name: "
        f"{', '.join(names())}; or give the path of a .py file with get_config()"
    )
