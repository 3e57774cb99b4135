"""Replay buffer ring semantics and state, rollout minibatches."""

import torch
from tensordict import TensorDict

from pickaxe.data import ReplayBuffer, RolloutBuffer


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
