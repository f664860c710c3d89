"""``dipsjax plan``: one row per named configuration, sizes consistent with the paper."""

import pytest

from dipsjax.model import CONFIG_NAMES
from dipsjax.model import plan as plan_lib


@pytest.fixture(scope="module")
def rows():
    return {row.name: row for row in plan_lib.plan_rows()}


def test_a_row_for_every_config(rows):
    assert list(rows) == list(CONFIG_NAMES)
    text = plan_lib.format_plan()
    for name in CONFIG_NAMES:
        assert any(line.startswith(name + " ") for line in text.splitlines())


def test_byte_sizes_follow_the_count(rows):
    for row in rows.values():
        n = row.num_params
        assert row.params_fp32_bytes == 4 * n
        assert row.adamw_bytes == 8 * n
        assert row.outer_bytes == 8 * n
        assert row.wire_bf16_bytes == 2 * n
        assert row.learner_bytes == 16 * n
        # The runtime learner's step peak: weights 4 + AdamW 8 + reference 4 + gradients 4,
        # and the step's new weights and AdamW (12) beside its inputs (it does not donate).
        assert row.learner_peak_bytes == 32 * n
        assert sum(plan_lib.learner_memory(n, donate=True).values()) == 20 * n


def test_100b_matches_the_paper_order_of_magnitude(rows):
    big = rows["dips-100b"]
    # Seed 000 sec. 1: FP32 100B ~ 400 GB; sec. 5: outer model + optimizer state ~ 1600 GB.
    assert big.params_fp32_bytes / 1e9 == pytest.approx(400, rel=0.05)
    ratio = big.outer_bytes / plan_lib.PAPER_100B_OUTER_BYTES
    assert 0.3 < ratio < 3.0
    assert big.learner_bytes / plan_lib.PAPER_100B_OUTER_BYTES == pytest.approx(1.0, rel=0.05)


def test_main_prints_the_table(capsys):
    assert plan_lib.main(["--config", "tiny", "--config", "dips-100b"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "dips-100b" in out and "small" not in out.split("GB = ")[0]
    assert "1600 GB" in out
