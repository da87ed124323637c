"""HostCopy: a tensor's copy to the host is taken when the HostCopy is made, not when it is read."""

import pytest
import torch

from hosttune_engine.host_copy import HostCopy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_the_copy_holds_the_values_at_creation_not_at_read_time():
    tokens = torch.tensor([5, 6, 7], device=DEVICE)
    top = torch.tensor([[1, 2], [3, 4], [5, 6]], device=DEVICE)
    copy = HostCopy([tokens, None, top])
    tokens.fill_(0)  # the next step overwriting the same device buffer
    top.fill_(0)
    assert copy.lists() == [[5, 6, 7], None, [[1, 2], [3, 4], [5, 6]]]


def test_caller_buffers_receive_the_copy():
    src = torch.arange(4, dtype=torch.int32, device=DEVICE)
    host = torch.full((4,), -1, dtype=torch.int32, pin_memory=DEVICE == "cuda")
    copy = HostCopy([src], into=[host])
    assert copy.lists() == [[0, 1, 2, 3]]
    assert host.tolist() == [0, 1, 2, 3]
    assert (copy.event is not None) == (DEVICE == "cuda")


def test_one_host_buffer_per_tensor():
    with pytest.raises(ValueError, match="2 tensors to copy but 1 host buffers"):
        HostCopy([torch.zeros(2), torch.zeros(2)], into=[torch.zeros(2)])
