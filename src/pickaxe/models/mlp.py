"""Multi-layer perceptrons and space helpers shared by the classic-RL models."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU}

FUNCTIONAL: dict[type[nn.Module], Callable[[torch.Tensor], torch.Tensor]] = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu}
"""The function an activation module of these types computes (an in-place ``nn.ReLU`` excepted: see ``functional``)."""

IN_PLACE: dict[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]] = {
    torch.tanh: torch.tanh_,
    torch.relu: torch.relu_,
}
"""The in-place twin of each ``FUNCTIONAL`` function. Applied to a linear layer's fresh output it gives the same
values and gradients (their backward uses the result, and a linear layer's backward does not use its output) without
allocating a second tensor of the layer's size."""


def hooked(layer: nn.Module) -> bool:
    """Whether ``layer`` has forward or backward hooks of its own (then it must be called as a module)."""
    return bool(layer._forward_hooks or layer._forward_pre_hooks or layer._backward_hooks or layer._backward_pre_hooks)


def functional(layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What ``layer`` computes as a plain function giving the same values, for a hook-free tanh or out-of-place
    relu; None for any other layer (call it as a module)."""
    fn = FUNCTIONAL.get(type(layer))
    return None if fn is None or getattr(layer, "inplace", False) or hooked(layer) else fn


class MLP(nn.Sequential):
    """An ``nn.Sequential`` of linear layers and activations whose forward calls the layers' functions directly.

    At the batch sizes of collection (one row per env) a small MLP costs its Python calls, not its arithmetic:
    calling each child ``nn.Module`` (``__call__``, hook checks, ``__getattr__`` for the weights) costs more than the
    ``linear`` or ``tanh`` inside it, and a 64x64 actor-critic makes ten such calls per step. Here a plain
    ``nn.Linear``, ``nn.Tanh`` or ``nn.ReLU`` child runs as ``F.linear``/``torch.tanh``/``torch.relu`` on its own
    parameters: the same ops, so the same values bit for bit, at less than half the time. Any other child, or one
    with forward or backward hooks, is called as a module. The state dict is a ``Sequential``'s.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layers in order (an activation right after a plain linear layer in place on its output)."""
        fresh = False
        for layer in self._modules.values():
            if type(layer) is nn.Linear and not hooked(layer):
                params = layer._parameters
                x = F.linear(x, params["weight"], params["bias"])
                fresh = True
            else:
                fn = functional(layer)
                x = layer(x) if fn is None else (IN_PLACE[fn] if fresh else fn)(x)
                fresh = False
        return x


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, activation: str = "tanh", out_gain: float = 1.0) -> MLP:
    """An MLP with orthogonal init (gain sqrt(2) on hidden layers, ``out_gain`` on the output, zero biases)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden]
    for a, b in itertools.pairwise(dims):
        layers += [_init(nn.Linear(a, b), math.sqrt(2)), ACTIVATIONS[activation]()]
    layers.append(_init(nn.Linear(dims[-1], out_dim), out_gain))
    return MLP(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def obs_dim(space: gym.Space) -> int:
    """Flat size of a Box observation space; other spaces are refused with a clear message."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise ValueError(
        f"MLP models take Box observations, got {space}; make the envs with pickaxe.envs.make (it flattens other "
        "spaces) or wrap the env in gymnasium.wrappers.FlattenObservation"
    )


def single_spaces(envs: gym.vector.VectorEnv | gym.Env) -> tuple[gym.Space, gym.Space]:
    """``(observation_space, action_space)`` of one sub-environment."""
    if isinstance(envs, gym.vector.VectorEnv):
        return envs.single_observation_space, envs.single_action_space
    return envs.observation_space, envs.action_space
