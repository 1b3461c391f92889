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


def test_an_item_packed_under_another_default_device_travels_on_the_cpu() -> None:
    """A worker that inherits the script's `torch.set_default_device` (forked, or spawned
    from a script that sets it on import) made the buffer there: on a GPU a forked worker
    cannot start CUDA, and no item came (the meta device stands in for a GPU)."""
    ids = np.arange(2 * 9, dtype=np.int64).reshape(2, 9)
    item = training_tensors(ids, [[4, 3], [9]], [[0, 1], [1]])
    with torch.device("meta"):
        packed = pack(dict(item))
    assert packed[PACKED_KEY].device.type == "cpu" and packed[PACKED_KEY].is_shared()
    back = unpack(packed)
    assert all(torch.equal(back[name], value) for name, value in item.items())


def test_ranks_recipes_are_compared_by_setting_naming_each_rank() -> None:
    """The check the loader's gathered state makes: equal recipes pass (a NaN figure too, not
    equal to itself), and each differing setting is named with rank 0's value and the rank's."""
    import pytest

    from zephon_torch.errors import ConfigError
    from zephon_torch.torch.distributed import check_same_recipe

    same = {"seed": 7, "token estimation": {"a": float("nan")}, "pack": {"algorithm": "wrap"}}
    check_same_recipe([same, dict(same), dict(same)])
    other = {**same, "pack": {"algorithm": "best_fit"}}
    with pytest.raises(ConfigError, match="the ranks run different recipes") as caught:
        check_same_recipe([same, dict(same), other, {**same, "seed": 8}])
    message = str(caught.value)
    assert "pack: {'algorithm': 'wrap'} on rank 0, {'algorithm': 'best_fit'} on rank 2" in message
    assert "seed: 7 on rank 0, 8 on rank 3" in message
    assert "rank 1" not in message
