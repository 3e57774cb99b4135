"""Recurrent PPO: PPO on an LSTM actor-critic, trained on fixed-length chunks of each env's rollout.

The collector stores, at every step, the hidden state the step started from (``h0``, ``c0``). The learner cuts
each env's ``[T]`` rollout into chunks of ``seq_len`` steps (the last one padded and masked), replays every chunk
from its stored initial state, zeroing the state where an episode starts inside it, and takes PPO steps on
minibatches of whole chunks. Targets bootstrap from V(``next_obs``) computed with the hidden state after the step,
also where an episode was truncated.
"""

from __future__ import annotations

from typing import Any

import torch

from pickaxe.algos.configs import RecurrentPPOConfig
from pickaxe.algos.core import clipped_surrogate, explained_variance, value_loss
from pickaxe.algos.ppo import PPO
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import sequence_chunks
from pickaxe.models.recurrent import RecurrentActorCritic


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the elements where ``mask`` is set."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def recurrent_ppo_loss(
    policy: RecurrentActorCritic, mb: Batch, cfg: RecurrentPPOConfig, clip: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's loss on a minibatch of ``B`` sequences of ``L`` steps (``[B, L]``: ``obs, action, logprob, value,
    advantage, return, starts, mask``; the initial states ``h0, c0`` ``[B, H]``), averaged over the unpadded
    steps (``mask``)."""
    logprob, entropy, value = (
        x.transpose(0, 1)
        for x in policy.evaluate_sequences(
            mb["obs"].transpose(0, 1), mb["action"].transpose(0, 1), (mb["h0"], mb["c0"]), mb["starts"].transpose(0, 1)
        )
    )
    mask = mb["mask"].to(logprob.dtype)
    advantage = mb["advantage"]
    if cfg.normalize_advantage:
        mean = masked_mean(advantage, mask)
        std = masked_mean((advantage - mean).pow(2), mask).sqrt()
        advantage = (advantage - mean) / (std + 1e-8)
    pg, _, clipped = clipped_surrogate(logprob, mb["logprob"], advantage, clip, clip)
    pg_loss = masked_mean(pg, mask)
    v_loss = masked_mean(value_loss(value, mb["value"], mb["return"], cfg.value_clip), mask)
    ent = masked_mean(entropy, mask)
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * ent
    log_ratio = (logprob.detach() - mb["logprob"]) * mask
    stats = {
        "loss/policy": pg_loss.detach(),
        "loss/value": v_loss.detach(),
        "loss/entropy": ent.detach(),
        "ppo/approx_kl": masked_mean(log_ratio.exp() - 1.0 - log_ratio, mask),
        "ppo/clip_fraction": masked_mean(clipped.float(), mask),
    }
    return loss, stats


@torch.no_grad()
def recurrent_targets(policy: RecurrentActorCritic, batch: Batch) -> torch.Tensor:
    """V(``next_obs``) of a ``[T, N]`` rollout, each with the hidden state after its step: the state the step
    started from (``h0``, ``c0``) advanced by its own observation, then one more step on ``next_obs``. Where the
    episode went on this equals the next step's value; where it ended (terminated or truncated) it is the value
    of the true final observation with the episode's own memory."""
    flat = batch.reshape(-1)
    _, _, after = policy.step(flat["obs"], (flat["h0"], flat["c0"]))
    _, next_value, _ = policy.step(flat["next_obs"], after)
    return next_value.view(batch.batch_size)


class RecurrentPPO(PPO):
    """PPO with an LSTM policy: GAE per rollout, then ``epochs`` passes over shuffled minibatches of sequences."""

    supports_data_parallel = False
    loss_name = "recurrent ppo loss"

    def __init__(self, policy: RecurrentActorCritic, config: RecurrentPPOConfig | None = None) -> None:
        super().__init__(policy, config or RecurrentPPOConfig())

    def update(self, batch: Batch) -> dict[str, float]:
        """GAE on the ``[T, N]`` rollout, chunked into sequences of ``seq_len`` steps, then PPO epochs over them."""
        cfg = self.config
        self._scale_rewards(batch)
        data = self.rollout.add(batch, recurrent_targets(self.policy, batch))
        seqs = sequence_chunks(self.rollout.batch, cfg.seq_len)
        lr = self._scheduled(cfg.lr, cfg.lr_schedule)
        clip = self._scheduled(cfg.clip, cfg.clip_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        per_mb = max(1, cfg.minibatch_size // cfg.seq_len)
        n_seq = seqs.batch_size[0]
        history: list[dict[str, float]] = []
        epochs_done = 0
        for _ in range(cfg.epochs):
            epochs_done += 1
            order = torch.randperm(n_seq)
            for i in range(0, n_seq, per_mb):
                mb = seqs[order[i : i + per_mb].to(seqs.device)]
                history.append(self._step(mb, cfg, clip, None))
            if cfg.target_kl is not None and history[-1]["ppo/approx_kl"] > cfg.target_kl:
                break
        metrics = {k: float(torch.tensor([h[k] for h in history]).mean()) for k in history[0]}
        metrics["ppo/explained_variance"] = explained_variance(data["value"], data["return"])
        metrics["ppo/lr"] = lr
        metrics["ppo/clip"] = clip
        metrics["ppo/epochs"] = float(epochs_done)
        metrics["ppo/gradient_steps"] = float(len(history))
        self._update_obs_stats(batch)
        return metrics

    def _loss(self, mb: Batch, cfg: Any, clip: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return recurrent_ppo_loss(self.policy, mb, cfg, clip)


def build_recurrent_ppo(
    config: RecurrentPPOConfig, envs: Any, model: Any, device: torch.device, seed: int
) -> RecurrentPPO:
    """Recurrent PPO with a ``RecurrentActorCritic`` sized from ``envs``' spaces: ``model.hidden`` is the MLP torso
    under the LSTM of ``config.lstm`` units."""
    policy = RecurrentActorCritic.for_env(
        envs,
        hidden=tuple(model.hidden),
        lstm=config.lstm,
        activation=model.activation,
        normalize_obs=config.normalize_obs,
        obs_clip=config.obs_clip,
        separate_critic=config.separate_critic,
    )
    return RecurrentPPO(policy.to(device), config)
