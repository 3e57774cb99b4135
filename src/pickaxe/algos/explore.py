"""PPO with an exploration bonus: random network distillation (RND, Burda et al. 2018) or the intrinsic curiosity
module (ICM, Pathak et al. 2017).

RND: a fixed, randomly initialised target network and a predictor trained to match it on (normalised) next
observations; the intrinsic reward is the predictor's error, divided by the running std of the non-episodic
intrinsic return. An intrinsic critic learns those returns under ``gamma_int`` (never cut at episode ends) beside the
actor-critic's extrinsic critic (``gamma``, episodic); the surrogate's advantage is
``ext_coef * A_ext + int_coef * A_int``.

ICM: an encoder ``phi``, an inverse model (``phi(s), phi(s') -> a``) and a forward model (``phi(s), a -> phi(s')``);
the intrinsic reward ``icm_eta * 0.5 * ||phi_hat(s') - phi(s')||^2`` is added to the env's reward and the module's
loss ``(1 - icm_beta) * L_inverse + icm_beta * L_forward`` (times ``icm_coef``) to PPO's.

The exploration networks, their observation statistics and RND's running intrinsic returns are in ``state_dict``,
so a resumed run continues with the same numbers; the model file holds only the policy (acting needs no bonus).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn
from torch.nn import functional as F

from pickaxe.algos.core import adam, value_loss
from pickaxe.algos.explore_configs import ExplorePPOConfig
from pickaxe.algos.explore_core import (
    combined_advantage,
    icm_forward_loss,
    icm_intrinsic_reward,
    icm_inverse_loss,
    icm_module_loss,
    normalize_intrinsic,
    rnd_intrinsic_reward,
    rnd_predictor_loss,
    running_discounted_returns,
)
from pickaxe.algos.ppo import PPO, actor_critic, compute_targets, normalized, ppo_loss
from pickaxe.data.batch import Batch
from pickaxe.data.returns import gae
from pickaxe.errors import ConfigError
from pickaxe.models.mlp import mlp, obs_dim, single_spaces
from pickaxe.models.normalize import RunningMeanStd


class RND(nn.Module):
    """RND's networks and statistics: the fixed target, the predictor, the intrinsic critic, the observation
    statistics they read, the running std of intrinsic returns and each env's running intrinsic return."""

    def __init__(self, in_dim: int, hidden: int, features: int, num_envs: int, obs_clip: float) -> None:
        super().__init__()
        self.obs_norm = RunningMeanStd((in_dim,), clip=obs_clip)
        self.target = mlp(in_dim, (hidden, hidden), features, activation="relu")
        self.target.requires_grad_(False)
        self.predictor = mlp(in_dim, (hidden, hidden), features, activation="relu")
        self.int_value = mlp(in_dim, (hidden, hidden), 1, activation="relu", out_gain=1.0)
        self.return_stats = RunningMeanStd(())
        self.register_buffer("int_return", torch.zeros(num_envs, dtype=torch.float32))

    def reward(self, next_obs: torch.Tensor) -> torch.Tensor:
        """Raw intrinsic reward of each row of ``next_obs`` ``[B, ...]`` (the predictor's error), ``[B]``."""
        x = self.obs_norm(next_obs.flatten(1))
        return rnd_intrinsic_reward(self.predictor(x), self.target(x))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """The intrinsic critic's value of each row of ``obs``, ``[B]``."""
        return self.int_value(self.obs_norm(obs.flatten(1))).squeeze(-1)


class ICM(nn.Module):
    """ICM's networks: the feature encoder, the inverse and forward models, and the observation statistics the
    encoder reads."""

    def __init__(self, in_dim: int, action_space: gym.Space, hidden: int, features: int, obs_clip: float) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        act_dim = int(action_space.n) if self.discrete else int(action_space.shape[0])
        self.act_dim = act_dim
        self.obs_norm = RunningMeanStd((in_dim,), clip=obs_clip)
        self.encoder = mlp(in_dim, (hidden, hidden), features, activation="relu")
        self.inverse = mlp(2 * features, (hidden,), act_dim, activation="relu")
        self.forward_model = mlp(features + act_dim, (hidden,), features, activation="relu")

    def action_input(self, action: torch.Tensor) -> torch.Tensor:
        """The forward model's action input: one-hot (Discrete) or the action itself (Box), ``[B, act_dim]``."""
        if self.discrete:
            return F.one_hot(action.long().reshape(-1), self.act_dim).float()
        return action.reshape(-1, self.act_dim).float()

    def predict(
        self, obs: torch.Tensor, next_obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(phi_hat(s'), phi(s'), inverse model output)`` for rows of ``(s, a, s')``."""
        phi = self.encoder(self.obs_norm(obs.flatten(1)))
        phi_next = self.encoder(self.obs_norm(next_obs.flatten(1)))
        predicted = self.forward_model(torch.cat([phi, self.action_input(action)], -1))
        return predicted, phi_next, self.inverse(torch.cat([phi, phi_next], -1))


class ExplorePPO(PPO):
    """PPO plus an RND or ICM exploration bonus (``config.intrinsic``); with ``intrinsic="none"`` it is PPO, the same
    numbers. One Adam steps the policy and the exploration networks together, their gradients clipped together."""

    supports_data_parallel = False
    loss_name = "ppo+exploration loss"

    def __init__(self, policy: nn.Module, explorer: nn.Module | None, config: ExplorePPOConfig) -> None:
        self.explorer = explorer
        self.explore_metrics: dict[str, float] = {}
        self.trained = policy if explorer is None else nn.ModuleDict({"policy": policy, "explorer": explorer})
        super().__init__(policy, config)

    def _trained(self) -> nn.Module:
        return self.trained

    def _optimizer(self) -> torch.optim.Optimizer:
        return adam(self._trained().parameters(), lr=self.config.lr, eps=self.config.adam_eps)

    def update(self, batch: Batch) -> dict[str, float]:
        """PPO's update with the bonus: intrinsic rewards of the rollout first, then PPO's epochs with the module's
        losses added."""
        metrics = super().update(batch)
        metrics.update(self.explore_metrics)
        return metrics

    def _targets(self, batch: Batch) -> Batch:
        cfg = self.config
        if isinstance(self.explorer, ICM):
            return self._icm_targets(batch)
        if not isinstance(self.explorer, RND):
            return compute_targets(self.policy, self.rollout, batch)
        rnd = self.explorer
        shape = batch.batch_size
        with torch.no_grad():
            rnd.obs_norm.update(batch["next_obs"].flatten(0, 1).flatten(1))
            raw = rnd.reward(batch["next_obs"].flatten(0, 1)).view(shape)
            returns, carry = running_discounted_returns(raw, rnd.int_return, cfg.gamma_int)
            rnd.int_return.copy_(carry)
            rnd.return_stats.update(returns.reshape(-1))
            reward = normalize_intrinsic(raw, rnd.return_stats.var)
            value = rnd.value(batch["obs"].flatten(0, 1)).view(shape)
            next_value = rnd.value(batch["next_obs"].flatten(0, 1)).view(shape)
            never = torch.zeros_like(batch["terminated"])
            int_adv, int_ret = gae(reward, value, next_value, never, never, cfg.gamma_int, cfg.gae_lambda)
        data = compute_targets(self.policy, self.rollout, batch)
        data.set("advantage", combined_advantage(data["advantage"], int_adv.reshape(-1), cfg.ext_coef, cfg.int_coef))
        data.set("int_return", int_ret.reshape(-1))
        self.explore_metrics = {
            "explore/intrinsic_reward": float(reward.mean()),
            "explore/raw_intrinsic_reward": float(raw.mean()),
        }
        return data

    def _icm_targets(self, batch: Batch) -> Batch:
        icm = self.explorer
        assert isinstance(icm, ICM)
        with torch.no_grad():
            icm.obs_norm.update(batch["next_obs"].flatten(0, 1).flatten(1))
            flat = batch.reshape(-1)
            predicted, phi_next, _ = icm.predict(flat["obs"], flat["next_obs"], flat["action"])
            bonus = icm_intrinsic_reward(predicted, phi_next, self.config.icm_eta).view(batch.batch_size)
        batch.set("reward", batch["reward"] + bonus)
        self.explore_metrics = {"explore/intrinsic_reward": float(bonus.mean())}
        return compute_targets(self.policy, self.rollout, batch)

    def _loss(self, mb: Batch, cfg: Any, clip: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, stats = ppo_loss(self.policy, mb, cfg, clip)
        if isinstance(self.explorer, RND):
            rnd = self.explorer
            x = rnd.obs_norm(mb["next_obs"].flatten(1))
            mask = None
            if cfg.rnd_update_proportion < 1.0:
                mask = torch.rand(x.shape[0], device=x.device) < cfg.rnd_update_proportion
            distil = rnd_predictor_loss(rnd.predictor(x), rnd.target(x), mask)
            v_int = value_loss(rnd.value(mb["obs"]), mb["int_return"], mb["int_return"]).mean()
            loss = loss + cfg.vf_coef * v_int + distil
            stats["loss/value_int"] = v_int.detach()
            stats["loss/rnd"] = distil.detach()
        elif isinstance(self.explorer, ICM):
            icm = self.explorer
            predicted, phi_next, inverse_out = icm.predict(mb["obs"], mb["next_obs"], mb["action"])
            inverse = icm_inverse_loss(inverse_out, mb["action"], icm.discrete)
            forward = icm_forward_loss(predicted, phi_next)
            loss = loss + cfg.icm_coef * icm_module_loss(inverse, forward, cfg.icm_beta)
            stats["loss/icm_inverse"] = inverse.detach()
            stats["loss/icm_forward"] = forward.detach()
        return loss, stats

    def state_dict(self) -> dict[str, Any]:
        """PPO's state plus the exploration networks, their observation and intrinsic-return statistics."""
        state = super().state_dict()
        if self.explorer is not None:
            state["explorer"] = self.explorer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        super().load_state_dict(state)
        if self.explorer is not None:
            self.explorer.load_state_dict(state["explorer"])


def build_explorer(config: ExplorePPOConfig, envs: Any) -> nn.Module | None:
    """The exploration networks ``config.intrinsic`` asks for, sized from ``envs`` (None for ``none``)."""
    if config.intrinsic == "none":
        return None
    obs_space, action_space = single_spaces(envs)
    in_dim = obs_dim(obs_space)
    if config.intrinsic == "rnd":
        num_envs = int(getattr(envs, "num_envs", 1))
        return RND(in_dim, config.explore_hidden, config.explore_features, num_envs, config.explore_obs_clip)
    if not isinstance(action_space, gym.spaces.Discrete | gym.spaces.Box) or (
        isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1
    ):
        raise ConfigError(
            f"--algo.intrinsic icm needs Discrete or 1-D Box actions, got {action_space}; use --algo.intrinsic rnd"
        )
    return ICM(in_dim, action_space, config.explore_hidden, config.explore_features, config.explore_obs_clip)


def build_ppo_explore(config: ExplorePPOConfig, envs: Any, model: Any, device: torch.device, seed: int) -> ExplorePPO:
    """PPO's actor-critic (as ``build_ppo`` makes it) with the exploration networks of ``config.intrinsic``."""
    policy = normalized(actor_critic(envs, model), envs, config).to(device)
    explorer = build_explorer(config, envs)
    return ExplorePPO(policy, None if explorer is None else explorer.to(device), config)
