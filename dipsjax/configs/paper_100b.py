"""Paper scale, for planning: the dips-100b model over 16 learner partitions and 16
followers (see ``_paper_scale.py``).

Run: ``.venv/bin/dipsjax run paper_100b --dry-run``.
"""

from dipsjax.configs import _paper_scale as common


def get_config(arg=None):
    return common.config("paper_100b", "dips-100b", followers=16)
