"""Replay buffer ring semantics and state, rollout minibatches."""

import pytest
import torch
from tensordict import TensorDict

from pickaxe.data import ReplayBuffer, RolloutBuffer, minibatches


def _batch(start: int, n: int) -> TensorDict:
    x = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"obs": x.unsqueeze(-1), "reward": x}, batch_size=[n])


def test_replay_overwrites_oldest_and_samples_stored() -> None:
    buf = ReplayBuffer(capacity=5, seed=0)
    buf.extend(_batch(0, 3))
    buf.extend(_batch(3, 4))  # 0..6 written, capacity 5 keeps 2..6
    assert len(buf) == 5
    assert set(buf._storage["reward"].tolist()) == {2.0, 3.0, 4.0, 5.0, 6.0}
    sample = buf.sample(100)
    assert set(sample["reward"].tolist()) <= {2.0, 3.0, 4.0, 5.0, 6.0}
    assert torch.equal(sample["obs"].squeeze(-1), sample["reward"])


def test_replay_time_major_batches_are_flattened() -> None:
    buf = ReplayBuffer(capacity=100, seed=0)
    buf.extend(_batch(0, 12).reshape(4, 3))
    assert len(buf) == 12


def test_replay_state_dict_round_trip_continues_identically() -> None:
    a = ReplayBuffer(capacity=8, seed=1)
    a.extend(_batch(0, 6))
    a.sample(4)
    b = ReplayBuffer(capacity=8, seed=99)
    b.load_state_dict(a.state_dict())
    for buf in (a, b):
        buf.extend(_batch(100, 5))
    assert torch.equal(a.sample(16)["reward"], b.sample(16)["reward"])
    assert torch.equal(a._storage["reward"], b._storage["reward"])


def test_rollout_minibatches_cover_every_step_once() -> None:
    T, N = 4, 3
    batch = TensorDict(
        {
            "reward": torch.ones(T, N),
            "value": torch.zeros(T, N),
            "terminated": torch.zeros(T, N, dtype=torch.bool),
            "truncated": torch.zeros(T, N, dtype=torch.bool),
            "obs": torch.arange(T * N, dtype=torch.float32).view(T, N),
        },
        batch_size=[T, N],
    )
    buf = RolloutBuffer(gamma=0.9, gae_lambda=0.8)
    flat = buf.add(batch, next_value=torch.zeros(T, N))
    assert flat.batch_size == torch.Size([T * N]) and "advantage" in flat and "return" in flat
    seen = torch.cat([mb["obs"] for mb in buf.minibatches(5)])
    assert sorted(seen.tolist()) == list(range(T * N))


def test_replay_samples_only_filled_slots_uniformly() -> None:
    # 4 of 100 slots filled; unfilled slots hold copies of the first item, so a sampler over the whole
    # capacity would return item 0 almost always.
    buf = ReplayBuffer(capacity=100, seed=0)
    buf.extend(_batch(0, 4))
    counts = torch.bincount(buf.sample(4000)["reward"].long(), minlength=4)
    assert counts.numel() == 4 and bool(((counts > 850) & (counts < 1150)).all()), counts


def test_replay_keeps_the_newest_when_a_batch_exceeds_capacity() -> None:
    buf = ReplayBuffer(capacity=4, seed=0)
    buf.extend(_batch(0, 2))
    buf.extend(_batch(10, 6))
    assert len(buf) == 4 and sorted(buf._storage["reward"].tolist()) == [12.0, 13.0, 14.0, 15.0]
    buf.extend(_batch(20, 1))  # the write position continues after the wrap: the oldest (12) goes
    assert sorted(buf._storage["reward"].tolist()) == [13.0, 14.0, 15.0, 20.0]


def test_replay_refuses_bad_capacity_and_empty_sampling() -> None:
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0)
    with pytest.raises(RuntimeError, match="empty"):
        ReplayBuffer(capacity=3).sample(1)
    empty = ReplayBuffer(capacity=3, seed=0)
    restored = ReplayBuffer(capacity=3, seed=1)
    restored.load_state_dict(empty.state_dict())
    assert len(restored) == 0
    with pytest.raises(RuntimeError, match="empty"):
        restored.sample(1)


def test_rollout_buffer_uses_its_gamma_and_lambda() -> None:
    # One env, 3 steps, V = 0, next V = 1: delta_t = r_t + 0.5, so A_2 = 3.5, A_1 = 2.5 + 0.5*0.8*3.5 = 3.9,
    # A_0 = 1.5 + 0.4*3.9 = 3.06 (with V = 0 and next V = 0, gamma and lambda would be interchangeable).
    T = 3
    batch = TensorDict(
        {
            "reward": torch.tensor([[1.0], [2.0], [3.0]]),
            "value": torch.zeros(T, 1),
            "terminated": torch.zeros(T, 1, dtype=torch.bool),
            "truncated": torch.zeros(T, 1, dtype=torch.bool),
        },
        batch_size=[T, 1],
    )
    flat = RolloutBuffer(gamma=0.5, gae_lambda=0.8).add(batch, next_value=torch.ones(T, 1))
    torch.testing.assert_close(flat["advantage"], torch.tensor([3.06, 3.9, 3.5]))
    torch.testing.assert_close(flat["return"], flat["advantage"])


def test_rollout_minibatches_before_add_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="add"):
        next(iter(RolloutBuffer(0.9, 0.9).minibatches(2)))


def test_minibatches_sizes_drop_last_and_generator() -> None:
    data = TensorDict({"x": torch.arange(10)}, batch_size=[10])
    assert [mb.batch_size[0] for mb in minibatches(data, 4)] == [4, 4, 2]
    assert [mb.batch_size[0] for mb in minibatches(data, 4, drop_last=True)] == [4, 4]
    first = [mb["x"].tolist() for mb in minibatches(data, 4, torch.Generator().manual_seed(3))]
    again = [mb["x"].tolist() for mb in minibatches(data, 4, torch.Generator().manual_seed(3))]
    assert first == again and sorted(x for mb in first for x in mb) == list(range(10)) and first[0] != [0, 1, 2, 3]


def test_replay_capacity_one_holds_the_newest() -> None:
    buf = ReplayBuffer(capacity=1, seed=0)
    buf.extend(_batch(0, 3))
    assert len(buf) == 1 and buf.sample(4)["reward"].tolist() == [2.0] * 4


def test_replay_emptied_by_a_restored_state_refuses_to_sample() -> None:
    buf = ReplayBuffer(capacity=4, seed=0)
    buf.extend(_batch(0, 2))
    buf.load_state_dict(ReplayBuffer(capacity=4, seed=0).state_dict())  # an empty buffer's state
    assert len(buf) == 0
    with pytest.raises(RuntimeError, match="cannot sample from an empty replay buffer"):
        buf.sample(1)


def test_rollout_minibatches_follow_the_given_generator() -> None:
    data = TensorDict({"reward": torch.zeros(6, 1), "value": torch.zeros(6, 1), "x": torch.arange(6.0).view(6, 1)},
                      batch_size=[6, 1])  # fmt: skip
    data["terminated"] = data["truncated"] = torch.zeros(6, 1, dtype=torch.bool)
    buf = RolloutBuffer(0.9, 0.9)
    flat = buf.add(data, torch.zeros(6, 1))
    got = [mb["x"].tolist() for mb in buf.minibatches(2, torch.Generator().manual_seed(5))]
    want = [mb["x"].tolist() for mb in minibatches(flat, 2, torch.Generator().manual_seed(5))]
    assert got == want and got != [mb["x"].tolist() for mb in minibatches(flat, 2, torch.Generator().manual_seed(6))]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_replay_on_a_device_stores_samples_and_restores_there() -> None:
    buf = ReplayBuffer(capacity=8, seed=0, device="cuda")
    buf.extend(_batch(0, 5))  # a CPU batch is moved to the buffer's device
    assert buf.sample(3)["reward"].device.type == "cuda"
    state = buf.state_dict()
    state["storage"] = {k: v.cpu() for k, v in state["storage"].items()}  # as read from a checkpoint file
    restored = ReplayBuffer(capacity=8, seed=0, device="cuda")
    restored.load_state_dict(state)
    assert restored._storage["reward"].device.type == "cuda"
    assert torch.equal(restored.sample(16)["reward"], buf.sample(16)["reward"])
    data = _batch(0, 6).to("cuda")
    assert all(mb.device.type == "cuda" for mb in minibatches(data, 4))
