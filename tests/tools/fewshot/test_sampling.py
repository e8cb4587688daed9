"""vit_ft.tools.fewshot.sampling: the k-shot draws (k per class, nested, seeded, disjoint from the held-out part)."""

import numpy as np
import pytest

from vit_ft.tools.fewshot.sampling import draw_fewshot


def test_draws_take_k_per_class_disjoint_from_the_holdout_nested_and_seeded():
    labels = np.repeat(np.arange(4), [30, 12, 20, 40])
    draw = draw_fewshot(labels, 4, (1, 3, 5), seed=7, holdout_fraction=0.25, max_holdout_per_class=6)
    assert np.bincount(labels[draw.holdout]).tolist() == [6, 3, 5, 6]  # 25 %, at most 6
    for k, rows in draw.shots.items():
        assert np.bincount(labels[rows], minlength=4).tolist() == [k] * 4
        assert len(set(rows.tolist())) == len(rows) and not set(rows.tolist()) & set(draw.holdout.tolist())
    assert set(draw.shots[1].tolist()) < set(draw.shots[3].tolist()) < set(draw.shots[5].tolist())
    again = draw_fewshot(labels, 4, (1, 3, 5), seed=7, holdout_fraction=0.25, max_holdout_per_class=6)
    assert all(np.array_equal(again.shots[k], draw.shots[k]) for k in (1, 3, 5))
    assert np.array_equal(again.holdout, draw.holdout)
    other = draw_fewshot(labels, 4, (1, 3, 5), seed=8, holdout_fraction=0.25, max_holdout_per_class=6)
    assert not np.array_equal(other.shots[5], draw.shots[5])


def test_excluded_rows_are_never_drawn_and_leave_the_other_picks_alone():
    labels = np.repeat(np.arange(3), 20)
    draw = draw_fewshot(labels, 3, (2,), seed=0)
    bad = int(draw.shots[2][0])  # a class-0 shot that turns out not to decode
    redrawn = draw_fewshot(labels, 3, (2,), seed=0, excluded=[bad])
    assert bad not in redrawn.shots[2] and bad not in redrawn.holdout
    assert np.array_equal(redrawn.shots[2][2:], draw.shots[2][2:])  # classes 1 and 2 unchanged
    assert redrawn.shots[2][0] == draw.shots[2][1]  # the class moves on along the same permutation


def test_a_class_too_small_for_the_largest_k_names_it_and_the_fix():
    labels = np.repeat(np.arange(3), [20, 7, 20])
    with pytest.raises(ValueError, match=r"--shots 10 .* class 'b' has 6 once 1 are held out.*up to 6"):
        draw_fewshot(labels, 3, (1, 10), seed=0, names=["a", "b", "c"])
