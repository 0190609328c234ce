"""Each view against the other views fused: the label-free agreement the service counts per view."""

from __future__ import annotations

import numpy as np
import pytest

from fusion import agrees_with_the_others, opinion_from_evidence, top_class_of_the_others

# Four views, three classes. Top classes of the views: 0, 1, 0, 2. The evidence summed over all views is
# [8, 4, 1] (the fused prediction: class 0), and over the others of each view:
#   view 0: [3, 4, 1] -> 1     view 1: [8, 0, 1] -> 0     view 2: [5, 4, 1] -> 0     view 3: [8, 4, 0] -> 0
# View 0 carries class 0, which the fused prediction follows, yet the others without it say class 1: against
# the fused prediction it would agree.
FOUR_VIEWS = np.array([[[5.0, 0.0, 0.0], [0.0, 4.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])


def test_each_view_against_the_others_summed():
    views = opinion_from_evidence(FOUR_VIEWS)
    assert top_class_of_the_others(views).tolist() == [[1, 0, 0, 0]]
    agrees, compared = agrees_with_the_others(views)
    assert agrees.tolist() == [[False, False, True, False]]
    assert compared.tolist() == [[True, True, True, True]]


def test_views_outside_the_mask_are_left_out_of_the_others_and_not_compared():
    # View 1 not fused. Others: view 0 [3, 0, 1] -> 0; view 1 [8, 0, 1] -> 0 (computed, not compared);
    # view 2 [5, 0, 1] -> 0; view 3 [8, 0, 0] -> 0.
    views = opinion_from_evidence(FOUR_VIEWS)
    mask = np.array([[True, False, True, True]])
    assert top_class_of_the_others(views, mask=mask).tolist() == [[0, 0, 0, 0]]
    agrees, compared = agrees_with_the_others(views, mask=mask)
    assert agrees.tolist() == [[True, False, True, False]]
    assert compared.tolist() == [[True, False, True, True]]


def test_a_view_fused_alone_is_not_compared():
    views = opinion_from_evidence(FOUR_VIEWS)
    mask = np.array([[False, False, True, False]])
    agrees, compared = agrees_with_the_others(views, mask=mask)
    assert not agrees.any() and not compared.any()
    # No other view fused: no evidence at all, and the tie goes to the lowest class.
    assert top_class_of_the_others(views, mask=mask)[0, 2] == 0


def test_ties_go_to_the_lowest_class():
    views = opinion_from_evidence(np.array([[[0.0, 0.0, 1.0], [0.0, 2.0, 2.0]]]))
    # view 0's others: [0, 2, 2] -> 1 (not 2); view 1's: [0, 0, 1] -> 2.
    assert top_class_of_the_others(views).tolist() == [[1, 2]]
    # view 1's own belief ties between classes 1 and 2: its top class is 1, not the others' 2.
    assert agrees_with_the_others(views)[0].tolist() == [[False, False]]


def _total_minus_own(evidence: np.ndarray) -> np.ndarray:
    """The others' top class the naive way: the sum over all views less the view's own."""
    return np.argmax(evidence.sum(axis=-2, keepdims=True) - evidence, axis=-1)


@pytest.mark.parametrize("position", [0, 1, 2])
def test_small_views_beside_a_huge_one_keep_their_evidence(position):
    # float32, as the heads give. One view with the capped evidence 1e13 for class 1; two small ones: [1, 0]
    # and [0, 2]. The huge view's others are [1, 2] -> class 1; the small views' others hold the huge one ->
    # class 1. In float32 1e13 + 2 is 1e13 (its spacing there is 2^20), so the total less the huge view's
    # own evidence leaves [1, 0] -> class 0 for it.
    rows = [np.array([1.0, 0.0]), np.array([0.0, 2.0])]
    rows.insert(position, np.array([0.0, 1e13]))
    evidence = np.array([rows], dtype=np.float32)
    views = opinion_from_evidence(evidence)
    assert _total_minus_own(evidence)[0, position] == 0  # the case the naive sums get wrong
    assert top_class_of_the_others(views).tolist() == [[1, 1, 1]]
    disagreeing = 1 if position == 0 else 0  # the view [1, 0]: its top class 0, the others' 1
    assert agrees_with_the_others(views)[0].tolist() == [[p != disagreeing for p in range(3)]]


def test_every_view_fused_keeps_the_views_device():
    """Without a mask, ``compared`` is built from nothing but the views' shape: it must still land on their
    device, or a CUDA batch fails with a device mismatch ('meta' stands in for CUDA on a CPU machine)."""
    torch = pytest.importorskip("torch")
    views = opinion_from_evidence(torch.zeros((4, 3, 5), device="meta"))
    agrees, compared = agrees_with_the_others(views)
    assert agrees.device.type == compared.device.type == "meta"
    assert tuple(agrees.shape) == tuple(compared.shape) == (4, 3)


def test_a_mask_is_checked_and_broadcast_as_fuse_does():
    """The mask follows fuse's rules: one row of views broadcasts over the samples (both results take the
    views' shape), a list is taken, and an integer mask is refused rather than used bitwise (``2 & True``
    is 0: a view 'present' as 2 would not be compared)."""
    views = opinion_from_evidence(np.repeat(FOUR_VIEWS, 2, axis=0))
    row = [True, False, True, True]
    agrees, compared = agrees_with_the_others(views, mask=np.array(row))
    assert agrees.tolist() == [[True, False, True, False]] * 2
    assert compared.tolist() == [row] * 2
    listed = agrees_with_the_others(views, mask=[row, row])
    assert listed[0].tolist() == agrees.tolist() and listed[1].tolist() == compared.tolist()
    assert top_class_of_the_others(views, mask=[row, row]).tolist() == [[0, 0, 0, 0]] * 2
    with pytest.raises(TypeError, match="boolean"):
        agrees_with_the_others(views, mask=np.array([[2, 0, 1, 1]] * 2))
    with pytest.raises(TypeError, match="boolean"):
        top_class_of_the_others(views, mask=np.array([[2, 0, 1, 1]] * 2))
