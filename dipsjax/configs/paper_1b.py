"""Paper scale, for planning: the llama3.2-1b model over 16 learner partitions and 4
followers (see ``_paper_scale.py``).

Run: ``.venv/bin/dipsjax run paper_1b --dry-run``.
"""

from dipsjax.configs import _paper_scale as common


def get_config(arg=None):
    return common.config("paper_1b", "llama3.2-1b", followers=4)
