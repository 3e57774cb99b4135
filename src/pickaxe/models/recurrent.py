"""A recurrent (LSTM) actor-critic, for tasks whose observations do not tell the whole state.

The hidden state is not kept in the module: whoever steps envs carries it (the collector for training, evaluation
its own) and hands it in. ``act_recurrent`` is one step for a batch of envs; ``evaluate_sequences`` replays
stored sequences from their stored initial states, resetting the state where an episode starts, with the same
per-step operations, so the learner's first log-probs equal the sampler's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.models.actor_critic import gaussian_entropy, gaussian_logprob
from pickaxe.models.encoders import encode, encoder_for
from pickaxe.models.mlp import ACTIVATIONS, single_spaces
from pickaxe.models.normalize import RunningMeanStd

State = tuple[torch.Tensor, torch.Tensor]
"""``(h, c)`` of the LSTM, each ``[B, lstm]``."""


def is_recurrent(policy: object) -> bool:
    """Whether ``policy`` needs a hidden state carried between steps (it has ``initial_state``)."""
    return callable(getattr(policy, "initial_state", None))


def _linear(a: int, b: int, gain: float) -> nn.Linear:
    layer = nn.Linear(a, b)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class RecurrentStream(nn.Module):
    """Encoder -> MLP torso (``hidden``) -> one-layer LSTM (``lstm`` units): the recurrent part of a network."""

    def __init__(self, obs_space: gym.Space, hidden: Sequence[int], lstm: int, activation: str) -> None:
        super().__init__()
        self.encoder, features = encoder_for(obs_space)
        layers: list[nn.Module] = []
        for size in hidden:
            layers += [_linear(features, size, math.sqrt(2)), ACTIVATIONS[activation]()]
            features = size
        self.torso = nn.Sequential(*layers)
        self.lstm = nn.LSTM(features, lstm)
        for name, p in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.zeros_(p)
            else:
                nn.init.orthogonal_(p, 1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Torso features of ``[B, *obs_shape]`` observations."""
        return self.torso(encode(self.encoder, obs))

    def core(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One LSTM step on features ``[B, F]``: ``(output [B, H], new state)``."""
        out, (h, c) = self.lstm(x.unsqueeze(0), (state[0].unsqueeze(0), state[1].unsqueeze(0)))
        return out.squeeze(0), (h.squeeze(0), c.squeeze(0))


class RecurrentActorCritic(nn.Module):
    """Encoder -> MLP torso (``hidden``) -> one-layer LSTM (``lstm`` units) -> actor and critic heads.

    With ``separate_critic`` the critic has its own encoder, torso and LSTM (Stable-Baselines3's default), so the
    value loss's gradient never reaches the actor's weights; the carried state is then both LSTMs' states side by
    side (``[B, 2 * lstm]``). Discrete actions are categorical, Box actions a diagonal Gaussian with a
    state-independent ``log_std`` (as ``ActorCritic``). With ``normalize_obs`` the observations pass through a
    ``RunningMeanStd`` (``obs_norm``) first, whose statistics the algorithm updates between rollouts.
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        hidden: Sequence[int] = (64,),
        lstm: int = 64,
        activation: str = "tanh",
        normalize_obs: bool = False,
        obs_clip: float = 10.0,
        separate_critic: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(action_space, gym.spaces.Discrete):
            self.discrete, out = True, int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box):
            self.discrete, out = False, int(np.prod(action_space.shape))
            self.log_std = nn.Parameter(torch.zeros(out))
        else:
            raise ValueError(f"RecurrentActorCritic supports Discrete and Box actions, got {action_space}")
        self.action_shape: tuple[int, ...] = () if self.discrete else tuple(action_space.shape)
        self.obs_norm = RunningMeanStd(tuple(obs_space.shape), clip=obs_clip) if normalize_obs else None
        self.stream = RecurrentStream(obs_space, hidden, lstm, activation)
        self.critic_stream = RecurrentStream(obs_space, hidden, lstm, activation) if separate_critic else None
        self.lstm_size = lstm
        self.state_size = lstm * (2 if separate_critic else 1)
        self.actor = _linear(lstm, out, 0.01)
        self.critic = _linear(lstm, 1, 1.0)

    @classmethod
    def for_env(cls, envs: gym.vector.VectorEnv | gym.Env, **kwargs) -> RecurrentActorCritic:
        """Size the networks from an env's single observation and action spaces."""
        obs_space, act_space = single_spaces(envs)
        return cls(obs_space, act_space, **kwargs)

    # ------------------------------------------------------------------------------------------- state
    def initial_state(self, n: int, device: str | torch.device = "cpu") -> State:
        """Zero state for ``n`` envs."""
        zeros = torch.zeros(n, self.state_size, device=device)
        return zeros, zeros.clone()

    @staticmethod
    def reset_state(state: State, done: torch.Tensor) -> State:
        """``state`` with the rows of envs whose episode ended (``done``, ``[B]`` bool) set to zero."""
        keep = (~done.to(state[0].device)).to(state[0].dtype).unsqueeze(-1)
        return state[0] * keep, state[1] * keep

    # ------------------------------------------------------------------------------------------- steps
    def _inputs(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Torso features of ``[B, *obs_shape]`` observations (normalised first when configured): the actor's
        (shared with the critic), and the critic's own with ``separate_critic``."""
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        critic = None if self.critic_stream is None else self.critic_stream.features(obs)
        return self.stream.features(obs), critic

    def _advance(
        self, x: torch.Tensor, x_critic: torch.Tensor | None, state: State
    ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One step of the LSTM(s): ``(actor output, critic output, new state)``."""
        if x_critic is None or self.critic_stream is None:
            out, new = self.stream.core(x, state)
            return out, out, new
        H = self.lstm_size
        (h, hc), (c, cc) = state[0].split(H, -1), state[1].split(H, -1)
        out, (h, c) = self.stream.core(x, (h, c))
        out_critic, (hc, cc) = self.critic_stream.core(x_critic, (hc, cc))
        return out, out_critic, (torch.cat([h, hc], -1), torch.cat([c, cc], -1))

    def step(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        """``(action logits or mean, value, new state)`` of one step."""
        out, out_critic, new = self._advance(*self._inputs(obs), state)
        return self.actor(out), self.critic(out_critic).squeeze(-1), new

    def act_recurrent(
        self, obs: torch.Tensor, state: State, deterministic: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], State]:
        """One step: ``(action, extras, new state)``; extras are ``logprob``, ``value`` and the state the step
        started from (``h0``, ``c0``), which the learner replays sequences from."""
        out, value, new = self.step(obs, state)
        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            if deterministic:
                action = out.argmax(-1)
            else:  # Gumbel-max sampling
                u = torch.rand_like(out).clamp_(min=1e-20)
                action = (logp_all - torch.log(-torch.log(u))).argmax(-1)
            logprob = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        else:
            action = out if deterministic else out + self.log_std.exp() * torch.randn_like(out)
            logprob = gaussian_logprob(out, self.log_std, action)
            action = action.reshape(-1, *self.action_shape)
        return action, {"logprob": logprob, "value": value, "h0": state[0], "c0": state[1]}, new

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Refused: a recurrent policy needs its hidden state carried between steps (``act_recurrent``)."""
        raise TypeError(
            "a recurrent policy acts with act_recurrent(obs, state); step it with pickaxe's Collector or evaluate, "
            "which carry its hidden state"
        )

    def evaluate_sequences(
        self, obs: torch.Tensor, action: torch.Tensor, state: State, starts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logprob, entropy, value)``, each ``[L, B]``, of sequences ``obs [L, B, ...]`` with ``action [L, B, ...]``
        replayed from ``state`` (``[B, H]`` each); ``starts[t]`` (``[L, B]`` bool) zeroes the state before step
        ``t`` where a new episode begins there."""
        L, B = obs.shape[:2]
        x, x_critic = self._inputs(obs.flatten(0, 1))
        x = x.view(L, B, -1)
        x_critic = None if x_critic is None else x_critic.view(L, B, -1)
        outs, outs_critic = [], []
        for t in range(L):
            if t > 0:
                state = self.reset_state(state, starts[t])
            out, out_critic, state = self._advance(x[t], None if x_critic is None else x_critic[t], state)
            outs.append(out)
            outs_critic.append(out_critic)
        out = self.actor(torch.stack(outs))
        value = self.critic(torch.stack(outs_critic)).squeeze(-1)
        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            logprob = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        else:
            logprob = gaussian_logprob(out, self.log_std, action.reshape(L, B, -1))
            entropy = gaussian_entropy(self.log_std).expand(L, B)
        return logprob, entropy, value
