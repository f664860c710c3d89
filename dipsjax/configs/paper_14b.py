"""Paper scale, for planning: the qwen3-14b model over 16 learner partitions and 8
followers (see ``_paper_scale.py``).

Run: ``.venv/bin/dipsjax run paper_14b --dry-run``.
"""

from dipsjax.configs import _paper_scale as common


def get_config(arg=None):
    return common.config("paper_14b", "qwen3-14b", followers=8)
