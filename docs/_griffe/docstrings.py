"""Griffe extension for the docs build (mkdocs.yml): reads the code's docstrings as written.

- Google-style ``Example:`` sections read as ``Examples:`` (griffe knows the plural only;
  under ``Example:`` a doctest renders as prose and its output lines as Markdown links).
- Sphinx roles (``:class:`~dipsjax.task.Task```, ``:func:`load_task```...) render as code
  (the last component where the target starts with ``~``), not as literal role text.
- A reStructuredText literal-block marker (a line ending in ``::``) ends in ``:``; the
  indented block after it is already a Markdown code block.
"""

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_LITERAL = re.compile(r"(?<=\S)::$", re.MULTILINE)
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    target = match.group(2)
    if match.group(1):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


class SphinxToMarkdown(griffe.Extension):
    """Rewrites each docstring once, before it is parsed."""

    def on_object(self, *, obj: griffe.Object, **kwargs: object) -> None:
        doc = obj.docstring
        if doc is None:
            return
        value = _EXAMPLE.sub(r"\1Examples:", doc.value)
        value = _LITERAL.sub(":", value)
        doc.value = _ROLE.sub(_code, value)
