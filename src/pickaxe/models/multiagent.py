"""The networks of the multi-agent algorithms (IPPO, MAPPO, independent DQN): agents as a tensor dimension.

Observations arrive as ``[..., A, D]``; every agent gets a policy, categorical over the same ``n_actions``, or
(``continuous``) a diagonal Gaussian over ``n_actions`` dimensions with a state-independent ``log_std`` (as PPO's
``ActorCritic``: log-probs and entropies summed over the dimensions, actions unbounded here and clipped by the env
adapter), and a value. With ``shared`` parameters one actor and one critic serve every agent, the agent's one-hot
id appended to their input (``agent_id``); otherwise each agent has its own actor and critic. The critic reads each
agent's own observation (IPPO) or the env's global state (MAPPO's centralised critic, ``central``). The learner works
on flat rows of single agent-steps: ``*_rows`` take ``[B, ...]`` inputs with each row's agent index.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.models.actor_critic import gaussian_entropy, gaussian_logprob
from pickaxe.models.mlp import mlp


def per_agent(
    nets: nn.ModuleList, x: torch.Tensor, agent: torch.Tensor, num_agents: int, with_id: bool, out: int
) -> torch.Tensor:
    """``nets`` on rows ``x`` (``[B, F]``) of agents ``agent`` (``[B]``): the one shared net (with each row's one-hot
    agent id appended when ``with_id``), or each agent's own net on its rows; ``[B, out]``."""
    if with_id:
        x = torch.cat([x, F.one_hot(agent, num_agents).to(x.dtype)], dim=-1)
    if len(nets) == 1:
        return nets[0](x)
    y = x.new_empty(x.shape[0], out)
    for j, net in enumerate(nets):
        rows = agent == j
        y[rows] = net(x[rows])
    return y


class MultiAgentActorCritic(nn.Module):
    """Categorical or Gaussian actors and value critics for ``num_agents`` agents (shared with an id input, or one
    each). A Gaussian actor's ``log_std`` is ``[1, d]`` with shared parameters, ``[A, d]`` (one row per agent)
    otherwise."""

    def __init__(
        self,
        num_agents: int,
        obs_dim: int,
        n_actions: int,
        state_dim: int | None = None,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        shared: bool = True,
        agent_id: bool = True,
        central: bool = False,
        continuous: bool = False,
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        if central and state_dim is None:
            raise ValueError("a central critic needs the env's state size (state_dim)")
        self.num_agents, self.obs_dim, self.n_actions = num_agents, obs_dim, n_actions
        self.shared, self.central, self.continuous = shared, central, continuous
        self.agent_id = shared and agent_id  # separate networks know their agent already
        ids = num_agents if self.agent_id else 0
        critic_in = (state_dim if central else obs_dim) + ids  # type: ignore[operator]
        copies = 1 if shared else num_agents
        self.actors = nn.ModuleList(
            mlp(obs_dim + ids, hidden, n_actions, activation, out_gain=0.01) for _ in range(copies)
        )
        self.critics = nn.ModuleList(mlp(critic_in, hidden, 1, activation, out_gain=1.0) for _ in range(copies))
        if continuous:
            self.log_std = nn.Parameter(torch.full((copies, n_actions), float(log_std_init)))

    def logits_rows(self, obs: torch.Tensor, agent: torch.Tensor) -> torch.Tensor:
        """``[B, n_actions]`` action logits (a Gaussian actor: means) of rows ``obs`` (``[B, D]``) of agents
        ``agent``."""
        return per_agent(self.actors, obs, agent, self.num_agents, self.agent_id, self.n_actions)

    def log_std_rows(self, agent: torch.Tensor) -> torch.Tensor:
        """A Gaussian actor's ``[B, n_actions]`` log standard deviations of rows of agents ``agent``."""
        if len(self.actors) == 1:
            return self.log_std[0].expand(agent.shape[0], self.n_actions)
        return self.log_std[agent]

    def value_rows(self, critic_in: torch.Tensor, agent: torch.Tensor) -> torch.Tensor:
        """``[B]`` values of rows of critic inputs (observation or global state) of agents ``agent``."""
        return per_agent(self.critics, critic_in, agent, self.num_agents, self.agent_id, 1).squeeze(-1)

    def evaluate_rows(
        self, obs: torch.Tensor, critic_in: torch.Tensor, agent: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logprob, entropy, value)`` of each row's ``action`` (``[B]`` ints, or ``[B, d]`` unclipped floats)
        under the current weights."""
        out = self.logits_rows(obs, agent)
        if self.continuous:
            log_std = self.log_std_rows(agent)
            return gaussian_logprob(out, log_std, action), gaussian_entropy(log_std), self.value_rows(critic_in, agent)
        logp = torch.log_softmax(out, dim=-1)
        logprob = logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return logprob, entropy, self.value_rows(critic_in, agent)

    def critic_input(self, obs: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """``[..., A, C]``: the global state repeated for every agent (central) or each agent's observation."""
        if not self.central:
            return obs
        assert state is not None
        return state.unsqueeze(-2).expand(*state.shape[:-1], self.num_agents, state.shape[-1])

    def _flat(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[..., A, F]`` as rows ``[B, F]`` with each row's agent index."""
        agent = torch.arange(self.num_agents, device=x.device).expand(*x.shape[:-1])
        return x.reshape(-1, x.shape[-1]), agent.reshape(-1)

    def value(self, obs: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., A]`` values of every agent."""
        x, agent = self._flat(self.critic_input(obs, state))
        return self.value_rows(x, agent).view(obs.shape[:-1])

    def act(
        self, obs: torch.Tensor, state: torch.Tensor | None = None, deterministic: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Actions of every agent, ``[..., A]`` ints or ``[..., A, d]`` floats (a Gaussian's sample, unclipped), with
        their ``logprob`` and ``value``; greedy (the categorical's mode, the Gaussian's mean) when ``deterministic``."""
        action, logprob = self._sample(obs, deterministic)
        return action, {"logprob": logprob, "value": self.value(obs, state)}

    def actions(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """``act``'s actions alone: no value, so no global state needed (acting outside training)."""
        return self._sample(obs, deterministic)[0]

    def _sample(self, obs: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        rows, agent = self._flat(obs)
        out = self.logits_rows(rows, agent)
        shape = obs.shape[:-1]
        if self.continuous:
            log_std = self.log_std_rows(agent)
            action = out if deterministic else out + log_std.exp() * torch.randn_like(out)
            logprob = gaussian_logprob(out, log_std, action)
            action = action.view(*shape, self.n_actions)
        else:
            logp = torch.log_softmax(out, dim=-1)
            action = logp.argmax(-1) if deterministic else torch.multinomial(logp.exp(), 1).squeeze(-1)
            logprob = logp.gather(-1, action.unsqueeze(-1)).squeeze(-1)
            action = action.view(shape)
        return action, logprob.view(shape)


class MultiAgentQNetwork(nn.Module):
    """Q-values of ``n_actions`` for every agent from its own observation (one shared network with the agent's
    one-hot id, or one per agent), acting epsilon-greedily with ``epsilon`` (greedy when ``deterministic``)."""

    def __init__(
        self,
        num_agents: int,
        obs_dim: int,
        n_actions: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        shared: bool = True,
        agent_id: bool = True,
    ) -> None:
        super().__init__()
        self.num_agents, self.n_actions, self.shared = num_agents, n_actions, shared
        self.agent_id = shared and agent_id
        ids = num_agents if self.agent_id else 0
        self.nets = nn.ModuleList(
            mlp(obs_dim + ids, hidden, n_actions, activation) for _ in range(1 if shared else num_agents)
        )
        self.epsilon = 0.0

    def q_rows(self, obs: torch.Tensor, agent: torch.Tensor) -> torch.Tensor:
        """``[B, n_actions]`` Q-values of rows ``obs`` (``[B, D]``) of agents ``agent`` (``[B]``)."""
        return per_agent(self.nets, obs, agent, self.num_agents, self.agent_id, self.n_actions)

    def act(
        self, obs: torch.Tensor, state: torch.Tensor | None = None, deterministic: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Actions ``[..., A]``: the greedy one, or with probability ``epsilon`` a uniform one."""
        agent = torch.arange(self.num_agents, device=obs.device).expand(*obs.shape[:-1]).reshape(-1)
        action = self.q_rows(obs.reshape(-1, obs.shape[-1]), agent).argmax(-1)
        if not deterministic and self.epsilon > 0:
            explore = torch.rand(action.shape, device=obs.device) < self.epsilon
            action = torch.where(explore, torch.randint_like(action, self.n_actions), action)
        return action.view(obs.shape[:-1]), {}

    def actions(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """``act``'s actions alone."""
        return self.act(obs, deterministic=deterministic)[0]
