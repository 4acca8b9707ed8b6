import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exgrpo.algorithm.selection import mean_token_entropy, select_lowest_entropy, token_entropy


def _pad(rows, width, side, fill):
    out = torch.full((len(rows), width), fill, dtype=torch.float64)
    mask = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        n = len(row)
        sl = slice(width - n, width) if side == "left" else slice(0, n)
        out[i, sl] = torch.tensor(row, dtype=torch.float64)
        mask[i, sl] = 1
    return out, mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("fill", [0.0, 9.0])
def test_authors_bug_regression_long_low_entropy_trajectory_wins(side, fill):
    # LUFFY#57: with the inverted mask the 1000-token row looked better; the true means are 0.20 vs 0.30.
    long_low = [0.1, 0.3] * 1500  # 3000 tokens, mean 0.20
    short_high = [0.2, 0.4] * 500  # 1000 tokens, mean 0.30
    ent, mask = _pad([short_high, long_low], 3000, side, fill)
    means = mean_token_entropy(ent, mask)
    assert means.tolist() == pytest.approx([0.30, 0.20])
    assert select_lowest_entropy(means) == 1


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=40), min_size=1, max_size=6
    ),
    side=st.sampled_from(["left", "right"]),
    extra=st.integers(0, 7),
    fill=st.floats(-5, 50),
)
def test_mean_matches_unpadded_mean_whatever_the_padding(rows, side, extra, fill):
    width = max(map(len, rows)) + extra
    ent, mask = _pad(rows, width, side, fill)
    got = mean_token_entropy(ent, mask)
    expected = [math.fsum(r) / len(r) for r in rows]
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    best = min(range(len(rows)), key=lambda i: (expected[i], i))
    assert expected[select_lowest_entropy(got)] == pytest.approx(expected[best], abs=1e-12)


def test_empty_rows_never_win_and_all_empty_is_an_error():
    ent = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    means = mean_token_entropy(ent, mask)
    assert math.isnan(means[1]) and select_lowest_entropy(means) == 0
    with pytest.raises(ValueError, match="empty"):
        select_lowest_entropy(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="shape"):
        mean_token_entropy(ent, mask[:, :1])


def test_ties_go_to_the_first_candidate():
    assert select_lowest_entropy([0.5, 0.2, 0.2]) == 1


def test_token_entropy_against_hand_values():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -1e9, -1e9]])
    got = token_entropy(logits)
    # uniform over 4 -> ln 4; a near one-hot -> ~0; p = (3/4, 1/4) -> the binary entropy
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert got.tolist() == pytest.approx([math.log(4.0), 0.0, h], abs=1e-6)
