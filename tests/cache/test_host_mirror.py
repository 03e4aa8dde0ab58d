"""HostMirroredTable: host edits, one copy of the dirty rows per flush."""

import torch

from oasr.cache.host_mirror import HostMirroredTable


def test_host_mirror_copies_only_the_dirty_range():
    table = HostMirroredTable((6, 3), torch.device("cpu"))
    table.host[2] = [1, 2, 3]
    table.host[4, 0] = 9
    table.mark_dirty(2)
    table.mark_dirty(4)
    table.device[0].fill_(-1)  # outside the dirty range: a flush must not touch it
    table.device[5].fill_(-1)
    assert table.is_dirty
    table.flush()
    assert not table.is_dirty
    assert table.device[2:5].tolist() == [[1, 2, 3], [0, 0, 0], [9, 0, 0]]
    assert table.device[0].tolist() == [-1, -1, -1] and table.device[5].tolist() == [-1, -1, -1]
    table.host[1, 1] = 5  # not marked: invisible until marked
    table.flush()
    assert table.device[1].tolist() == [0, 0, 0]
