"""The KV allocation context answers only vLLM's one int8 buffer, and undoes itself."""

import torch

from belayer_vllm.kv import broker_kv_allocation


def test_only_the_kv_buffer_is_redirected_and_torch_zeros_is_restored():
    original = torch.zeros
    marker = torch.ones(16, dtype=torch.int8)
    asked = []

    def provide(n):
        asked.append(n)
        return marker[:n]

    with broker_kv_allocation(provide):
        assert torch.zeros(3, dtype=torch.float32).dtype == torch.float32
        buf = torch.zeros(8, dtype=torch.int8, device="cpu")
        second = torch.zeros(8, dtype=torch.int8)
    assert asked == [8]
    assert buf.data_ptr() == marker.data_ptr()
    assert second.data_ptr() != marker.data_ptr() and int(second.sum()) == 0
    assert torch.zeros is original


def test_restored_after_an_exception():
    original = torch.zeros
    try:
        with broker_kv_allocation(lambda n: None):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert torch.zeros is original
