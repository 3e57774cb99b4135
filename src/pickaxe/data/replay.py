"""Replay pieces of the DQN family: n-step accumulation, a sum-tree and prioritized replay.

``ReplayBuffer`` (``data.buffers``) stays the uniform buffer; this module adds what Rainbow's parts need, each
with its state in ``state_dict`` so a resumed run continues bit for bit:

- :func:`nstep_windows` / :class:`NStepAccumulator`: per-env n-step returns over a time-major ``[T, N]`` stream,
  carried across collect boundaries, each stored transition with its own discount (``gamma^k``, 0 if terminated);
- :class:`SumTree`: O(log n) priority updates and prefix-sum lookups;
- :class:`PrioritizedReplayBuffer`: stratified proportional sampling and importance weights
  (:func:`importance_weights`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer

NSTEP_KEYS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")
"""Keys :class:`NStepAccumulator` reads from a collected batch."""


def _host(x: torch.Tensor | np.ndarray | list[float], dtype: type) -> np.ndarray:
    """A CPU tensor, array or list as a numpy array of ``dtype`` (a tensor without a copy where it can)."""
    return x.detach().cpu().numpy().astype(dtype, copy=False) if isinstance(x, torch.Tensor) else np.asarray(x, dtype)


def nstep_windows(
    reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, gamma: float, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step returns of every start step of a time-major ``[L, N]`` stream.

    The window from step ``t`` sums ``k <= n`` rewards ``sum_j gamma^j r[t+j]`` and stops after an episode's last
    step (terminated or truncated). Returns ``(returns, discount, last, complete)``, each ``[L, N]``: ``discount``
    is ``gamma^k`` (0 when the window ended in a termination, so there is no bootstrap); ``last`` the time index
    of the window's last step (its ``next_obs`` is the bootstrap observation, the true final one at a truncation);
    ``complete`` whether the window is final (``n`` steps or an episode end) rather than cut by the stream's end.
    """
    length = reward.shape[0]
    done = terminated | truncated
    returns = torch.zeros_like(reward)
    steps = torch.zeros(reward.shape, dtype=torch.long)
    ended = torch.zeros(reward.shape, dtype=torch.bool)  # the window reached an episode's last step
    ended_term = torch.zeros(reward.shape, dtype=torch.bool)  # ... and it was a termination
    alive = torch.ones(reward.shape, dtype=torch.bool)
    for j in range(min(n, length)):
        on = alive.clone()
        on[length - j :] = False  # step t + j lies past the stream's end
        r_j, d_j, t_j = (torch.zeros_like(x) for x in (reward, done, terminated))
        r_j[: length - j], d_j[: length - j], t_j[: length - j] = reward[j:], done[j:], terminated[j:]
        returns = returns + torch.where(on, gamma**j * r_j, torch.zeros_like(r_j))
        steps += on.long()
        ended |= on & d_j
        ended_term |= on & t_j
        alive = on & ~d_j
    complete = ended | (steps == n)
    discount = torch.where(ended_term, torch.zeros_like(reward), gamma ** steps.to(reward.dtype))
    start = torch.arange(length).view(-1, *[1] * (reward.dim() - 1))
    return returns, discount, start + steps - 1, complete


class NStepAccumulator:
    """Turns collected ``[T, N]`` batches into n-step transitions, per env and across collect boundaries.

    Each :meth:`push` returns the transitions whose windows are now final (time-major order, flattened):
    ``obs``/``action`` of the window's first step, ``reward`` the discounted n-step sum, ``discount``
    (``gamma^k`` or 0 after a termination), ``terminated`` and the window's last ``next_obs``. Steps whose
    window still needs the next collect are kept (at most ``n - 1`` per env) and are part of ``state_dict``.
    """

    def __init__(self, n: int, gamma: float) -> None:
        if n < 1:
            raise ValueError(f"n_step must be >= 1, got {n}")
        self.n = n
        self.gamma = gamma
        self._pending: TensorDict | None = None  # [P, N] last steps of the stream
        self._emitted: torch.Tensor | None = None  # [P, N] which of them already produced their transition

    def push(self, batch: Batch) -> Batch:
        """Append ``batch`` (``[T, N]``, keys :data:`NSTEP_KEYS`) and return the transitions completed by it."""
        data = batch.select(*NSTEP_KEYS)
        length_new, n_envs = data.batch_size[0], data.batch_size[1]
        emitted = torch.zeros(length_new, n_envs, dtype=torch.bool)
        if self._pending is not None:
            data = torch.cat([self._pending, data], 0)
            emitted = torch.cat([self._emitted, emitted], 0)
        returns, discount, last, complete = nstep_windows(
            data["reward"], data["terminated"].bool(), data["truncated"].bool(), self.gamma, self.n
        )
        take = complete & ~emitted
        env = torch.arange(n_envs).expand_as(last)
        out = TensorDict(
            {
                "obs": data["obs"][take],
                "action": data["action"][take],
                "reward": returns[take],
                "discount": discount[take],
                "terminated": discount[take] == 0,
                "next_obs": data["next_obs"][last[take], env[take]],
            },
            batch_size=[int(take.sum())],
        )
        keep = min(self.n - 1, data.batch_size[0])
        self._pending = data[data.batch_size[0] - keep :].clone() if keep else None
        self._emitted = (emitted | take)[data.batch_size[0] - keep :].clone() if keep else None
        return out

    def state_dict(self) -> dict[str, Any]:
        """The pending steps and which of them were already emitted."""
        if self._pending is None:
            return {"pending": None, "emitted": None, "shape": None}
        return {
            "pending": self._pending.to_dict(),
            "emitted": self._emitted,
            "shape": list(self._pending.batch_size),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        if state["pending"] is None:
            self._pending = self._emitted = None
            return
        self._pending = TensorDict(state["pending"], batch_size=list(state["shape"]))
        self._emitted = state["emitted"].bool()


class SumTree:
    """A binary tree of non-negative priorities whose every node holds the sum of its leaves.

    ``update`` and ``find`` (the leaf where a prefix sum falls) are O(log capacity), vectorised over a batch of
    indices or prefix sums. Sums are float64, in numpy (a level costs a few microseconds, not a torch op's ten).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"sum-tree capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.depth = max(capacity - 1, 0).bit_length()
        self.size = 1 << self.depth  # leaves: capacity rounded up to a power of two
        self.tree = np.zeros(2 * self.size, dtype=np.float64)  # node i's children: 2i, 2i + 1; root 1

    def total(self) -> float:
        """Sum of all priorities."""
        return float(self.tree[1])

    def get(self, index: torch.Tensor) -> torch.Tensor:
        """Priorities at leaf ``index`` (float64)."""
        return torch.from_numpy(self.tree[_host(index, np.int64) + self.size])

    def update(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Set the priorities at ``index`` (the last value wins for a repeated index) and refresh their sums."""
        node = _host(index, np.int64) + self.size
        self.tree[node] = _host(priority, np.float64)
        for _ in range(self.depth):
            node //= 2  # a repeated parent is written twice with the same sum
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]

    def find(self, prefix: torch.Tensor) -> torch.Tensor:
        """Leaf index ``i`` with ``sum(p[:i]) <= prefix < sum(p[:i+1])`` for each prefix sum."""
        node = np.ones(len(prefix), dtype=np.int64)
        value = _host(prefix, np.float64).copy()
        for _ in range(self.depth):
            node *= 2
            left_sum = self.tree[node]
            right = value >= left_sum
            value -= np.where(right, left_sum, 0.0)
            node += right
        return torch.from_numpy(np.minimum(node - self.size, self.capacity - 1))


def importance_weights(probs: torch.Tensor, size: int, beta: float) -> torch.Tensor:
    """Prioritized replay's importance weights ``(size * P(i)) ** -beta``, divided by their maximum in the batch
    (so the largest is 1 and the weights only ever shrink an update)."""
    w = (size * probs.to(torch.float64)) ** (-beta)
    return (w / w.max()).to(torch.float32)


class PrioritizedReplayBuffer(ReplayBuffer):
    """Fixed-capacity replay with proportional prioritized sampling (Schaul et al. 2016).

    Transition ``i`` is drawn with probability ``p_i^alpha / sum_j p_j^alpha``; a batch of ``n`` is stratified
    (one draw uniformly inside each of ``n`` equal segments of the total) from the buffer's own seeded generator.
    New transitions get the largest priority seen so far; :meth:`update_priorities` sets ``|error| + eps``.
    Storage, tree, maximum and generator are all in ``state_dict``; the ring storage is ``ReplayBuffer``'s.
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        eps: float = 1e-6,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(capacity, seed=seed, device=device)
        self.alpha = alpha
        self.eps = eps
        self.tree = SumTree(capacity)
        self.max_priority = 1.0  # of |error| + eps, before the alpha power

    def extend(self, batch: Batch) -> torch.Tensor:
        """Append every transition of ``batch`` (flattened) with the maximum priority, overwriting the oldest."""
        idx = super().extend(batch)
        if len(idx):
            self.tree.update(idx, np.full(len(idx), self.max_priority**self.alpha))
        return idx

    def sample(self, n: int, beta: float) -> tuple[Batch, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """``(transitions, indices, importance weights)`` of ``n`` stratified proportional draws."""
        if self._storage is None or self._size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer; extend it first")
        total = self.tree.total()
        u = torch.rand(n, generator=self.generator, dtype=torch.float64)
        prefix = (torch.arange(n, dtype=torch.float64) + u) * (total / n)
        idx = self.tree.find(prefix).clamp_(max=self._size - 1)
        probs = self.tree.get(idx) / total
        weights = importance_weights(probs, self._size, beta)
        return self._storage[idx.to(self.device)], idx, weights.to(self.device)

    def update_priorities(self, index: torch.Tensor, error: torch.Tensor | np.ndarray | list[float]) -> None:
        """Set the priorities of ``index`` to ``|error| + eps`` (host values: a CPU tensor, array or list)."""
        p = np.abs(_host(error, np.float64)) + self.eps
        self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.update(index, p**self.alpha)

    def state_dict(self) -> dict[str, Any]:
        """Contents, write position, priorities, their maximum and the sampling RNG."""
        return {**super().state_dict(), "tree": self.tree.tree.copy(), "max_priority": self.max_priority}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        super().load_state_dict(state)
        self.tree.tree = np.array(state["tree"], dtype=np.float64)
        self.max_priority = float(state["max_priority"])
