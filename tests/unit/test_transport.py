"""Worker items travel as one buffer: every tensor comes back equal, as a view of that buffer."""

from __future__ import annotations

import numpy as np
import torch

from zephon_torch.ops.training import training_tensors
from zephon_torch.torch._transport import PACKED_KEY, pack, unpack


def test_a_training_item_round_trips_through_one_buffer() -> None:
    ids = np.arange(2 * 9, dtype=np.int64).reshape(2, 9)
    item: dict[str, object] = dict(
        training_tensors(ids, [[4, 3], [9]], [[0, 1], [1]], attention_mask=True)
    )
    item["payloads"] = [[{"image": b"\x00\x01"}], []]
    item["zephon"] = {"lane": 3, "state": {"turn": 1}}
    item["empty"] = torch.empty(0, dtype=torch.int32)
    item["complex"] = torch.tensor([1 + 2j], dtype=torch.complex128)  # 16-byte elements
    packed = pack(item)
    buffers = [v for v in packed.values() if isinstance(v, torch.Tensor)]
    assert len(buffers) == 1 and buffers[0] is packed[PACKED_KEY]
    assert buffers[0].is_shared()  # torch sends it without another copy
    back = unpack(packed)
    assert set(back) == set(item)
    for name, value in item.items():
        if isinstance(value, torch.Tensor):
            got = back[name]
            assert got.dtype == value.dtype and got.shape == value.shape, name
            assert torch.equal(got, value), name
            # scalars are copied out, so a logged num_valid_tokens keeps no micro-batch alive
            shared = got.untyped_storage().data_ptr() == buffers[0].untyped_storage().data_ptr()
            assert shared == (got.dim() > 0), name
        else:
            assert back[name] == value
    assert unpack({"input_ids": ids}) == {"input_ids": ids}  # an item never packed
