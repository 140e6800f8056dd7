"""The opcode table is data: one row per opcode, families contiguous in the order the sweeps dispatch on,
attribute layouts whose lengths the loader and validator read."""
import numpy as np
import pytest

from jitape_kernels import opcodes as oc


def test_the_table_matches_the_opcode_numbers_and_family_ranges():
    assert len(oc.TABLE) == oc.INV + 1
    assert oc.NAMES[oc.GATHER] == "gather" and oc.FAMILIES[oc.EQUAL] == "compare" and oc.ARITY[oc.WHERE] == 3
    assert all(f == "unary" for f in oc.FAMILIES[:oc.UNARY_LAST + 1])
    assert all(f in ("binary", "compare") for f in oc.FAMILIES[oc.UNARY_LAST + 1:oc.BINARY_LAST + 1])


@pytest.mark.parametrize("swap", [(oc.ATAN2, oc.GREATER), (oc.SUM, oc.CUMSUM), (oc.COPY, oc.ADD)])
def test_an_opcode_out_of_its_family_range_fails_the_check(monkeypatch, swap):
    families = list(oc.FAMILIES)
    i, j = swap
    families[i], families[j] = families[j], families[i]
    monkeypatch.setattr(oc, "FAMILIES", tuple(families))
    with pytest.raises(AssertionError, match="famil"):
        oc._check_table()


def test_attribute_lengths_follow_the_layouts():
    gather = np.array([2, 5, 3, 4, 0, 1, 2, 3])
    assert oc.attribute_length(oc.GATHER, gather, 0) == 8
    slice_block = np.array([2, 4, 4, 2, 2, 0, 0, 1, 1])
    assert oc.attribute_length(oc.SLICE, slice_block, 0) == 9
    assert oc.attribute_length(oc.TRANSPOSE, np.array([3, 1, 2, 3, 2, 1, 0]), 0) == 7
    assert oc.attribute_length(oc.MATMUL, np.zeros(6, np.int64), 0) == 6
    assert oc.attribute_length(oc.CLIP, np.zeros(1, np.int64), 0) == 1
    assert oc.attribute_length(oc.ADD, np.zeros(0, np.int64), 0) == 0
