"""Hand-written single-bug mutants, each with the tests that must catch it: PPO, DQN, the buffers and the loss pieces,
then a realistic sample over the newer modules (off-policy, LLM algorithms, eval, dist, rollout, exp).

Each mutant is applied to a copy of ``src/`` in a temporary folder (the working tree is never touched), the
named tests run against that copy (``PYTHONPATH`` puts it ahead of the editable install), and the mutant is
*caught* when they fail. A baseline run without any mutant must pass first.

    .venv/bin/python tests/mutation/named_mutants.py            # all; exit 1 if one survives
    .venv/bin/python tests/mutation/named_mutants.py dqn-double  # by name (prefixes work)
    .venv/bin/python tests/mutation/named_mutants.py --area eval # one area, with its kill ratio
    .venv/bin/python tests/mutation/named_mutants.py --markdown  # the table in docs/testing.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PPO, DQN, CORE = "src/pickaxe/algos/ppo.py", "src/pickaxe/algos/dqn.py", "src/pickaxe/algos/core.py"
BUFFERS, BATCH = "src/pickaxe/data/buffers.py", "src/pickaxe/data/batch.py"
ACTOR_CRITIC = "src/pickaxe/models/actor_critic.py"
T_PPO, T_DQN, T_BUF = "tests/test_options_ppo.py", "tests/test_options_dqn.py", "tests/test_buffers.py"
# the newer modules (issue 26, section 7)
SAC, TD3, CONT = "src/pickaxe/algos/sac.py", "src/pickaxe/algos/td3.py", "src/pickaxe/models/continuous.py"
LLM_PPO, GRPO, DPO = "src/pickaxe/algos/llm_ppo.py", "src/pickaxe/algos/grpo.py", "src/pickaxe/algos/dpo.py"
RM, RLHF = "src/pickaxe/algos/reward_model.py", "src/pickaxe/algos/rlhf_core.py"
ARENA, ALARMS = "src/pickaxe/eval/arena.py", "src/pickaxe/eval/alarms.py"
SELECTION, STATS = "src/pickaxe/eval/selection.py", "src/pickaxe/eval/stats.py"
WORKER, ENGINES = "src/pickaxe/dist/engine_worker.py", "src/pickaxe/dist/llm_engines.py"
LEARNERS, JOBS = "src/pickaxe/dist/learners.py", "src/pickaxe/dist/jobs.py"
DATA_PARALLEL = "src/pickaxe/dist/data_parallel.py"
AGENT, SCHED = "src/pickaxe/rollout/agent.py", "src/pickaxe/rollout/pipelined.py"
PIPELINE, CKPT_EVAL = "src/pickaxe/exp/pipeline.py", "src/pickaxe/exp/checkpoint_eval.py"
LLM_RUNS = "src/pickaxe/train/llm.py"


@dataclass(frozen=True)
class Mutant:
    """Replace ``old`` (which must occur exactly once in ``path``) by ``new``; ``tests`` must then fail."""

    name: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    # --- the seven the suite missed before
    Mutant("ppo-normalize-ignored", "PPO normalize_advantage ignored", PPO,
           'normalize(mb["advantage"]) if cfg.normalize_advantage else mb["advantage"]', 'mb["advantage"]',
           (f"{T_PPO}::test_normalize_advantage_takes_effect",)),
    Mutant("ppo-normalize-inverted", "PPO normalize_advantage inverted", PPO,
           "if cfg.normalize_advantage else", "if not cfg.normalize_advantage else",
           (f"{T_PPO}::test_normalize_advantage_takes_effect",)),
    Mutant("ppo-value-clip-dropped", "value_clip never reaches the value loss", PPO,
           'mb["return"], cfg.value_clip)', 'mb["return"])',
           (f"{T_PPO}::test_value_clip_reaches_the_value_loss",)),
    Mutant("ppo-target-kl-never", "target_kl early stop can never fire", PPO,
           "if cfg.target_kl is not None and", "if cfg.target_kl is None and",
           (f"{T_PPO}::test_target_kl_stops_the_epochs_early",)),
    Mutant("ppo-target-kl-first-minibatch", "target_kl checks the first minibatch (KL 0, never fires)", PPO,
           'history[-1]["ppo/approx_kl"] > cfg.target_kl', 'history[0]["ppo/approx_kl"] > cfg.target_kl',
           (f"{T_PPO}::test_target_kl_stops_the_epochs_early",)),
    Mutant("ppo-target-kl-inverted", "target_kl comparison inverted", PPO,
           '["ppo/approx_kl"] > cfg.target_kl', '["ppo/approx_kl"] < cfg.target_kl',
           (f"{T_PPO}::test_target_kl_stops_the_epochs_early",)),
    Mutant("dqn-double-from-target", "double DQN takes the argmax from the target network", DQN,
           'next_action = qnet(mb["next_obs"]).argmax(-1, keepdim=True)',
           "next_action = next_q_target.argmax(-1, keepdim=True)",
           (f"{T_DQN}::test_double_dqn_takes_the_argmax_from_the_online_network",)),
    Mutant("dqn-double-inverted", "double flag inverted", DQN, "if cfg.double:", "if not cfg.double:",
           (f"{T_DQN}::test_double_dqn_takes_the_argmax_from_the_online_network",)),
    Mutant("dqn-eps-fraction-ignored", "epsilon schedule ignores eps_fraction", DQN,
           "max(cfg.eps_fraction * total_steps, 1)", "max(total_steps, 1)",
           (f"{T_DQN}::test_epsilon_decays_over_eps_fraction_of_training",)),
    Mutant("dqn-polyak-backwards", "Polyak update written backwards (online pulled to target)", DQN,
           "t.lerp_(p, self.config.tau)", "p.lerp_(t, self.config.tau)",
           (f"{T_DQN}::test_polyak_update_moves_the_target_tau_of_the_way",)),
    Mutant("dqn-polyak-one-minus-tau", "Polyak update keeps tau of the old target", DQN,
           "t.lerp_(p, self.config.tau)", "t.lerp_(p, 1.0 - self.config.tau)",
           (f"{T_DQN}::test_polyak_update_moves_the_target_tau_of_the_way",)),
    Mutant("replay-samples-unfilled", "replay buffer samples slots never filled", BUFFERS,
           "torch.randint(self._size,", "torch.randint(self.capacity,",
           (f"{T_BUF}::test_replay_samples_only_filled_slots_uniformly",)),
    # --- every other PPOConfig field
    Mutant("ppo-lr-schedule-ignored", "lr_schedule ignored", PPO,
           "lr = self._scheduled(cfg.lr, cfg.lr_schedule)", "lr = cfg.lr",
           (f"{T_PPO}::test_first_step_follows_lr_lr_schedule_and_adam_eps",)),
    Mutant("ppo-lr-not-applied", "scheduled lr not given to the optimizer", PPO,
           'group["lr"] = lr', 'group["lr"] = cfg.lr',
           (f"{T_PPO}::test_first_step_follows_lr_lr_schedule_and_adam_eps",)),
    Mutant("ppo-clip-schedule-ignored", "clip_schedule ignored", PPO,
           "clip = self._scheduled(cfg.clip, cfg.clip_schedule)", "clip = cfg.clip",
           (f"{T_PPO}::test_clip_schedule_reaches_the_loss",)),
    Mutant("ppo-clip-not-applied", "scheduled clip reported but the loss uses cfg.clip", PPO,
           "ppo_loss(self.policy, mb, cfg, clip)", "ppo_loss(self.policy, mb, cfg, cfg.clip)",
           (f"{T_PPO}::test_clip_schedule_reaches_the_loss",)),
    Mutant("ppo-clip-arg-ignored", "ppo_loss ignores its clip argument", PPO,
           "advantage, clip, clip)", "advantage, cfg.clip, cfg.clip)",
           (f"{T_PPO}::test_clip_argument_bounds_the_ratio",)),
    Mutant("ppo-gamma-lambda-swapped", "gamma and gae_lambda swapped", PPO,
           "RolloutBuffer(cfg.gamma, cfg.gae_lambda)", "RolloutBuffer(cfg.gae_lambda, cfg.gamma)",
           (f"{T_PPO}::test_compute_targets_use_gamma_and_gae_lambda",)),
    Mutant("ppo-gamma-ignored", "gamma ignored (0.99)", PPO,
           "RolloutBuffer(cfg.gamma, cfg.gae_lambda)", "RolloutBuffer(0.99, cfg.gae_lambda)",
           (f"{T_PPO}::test_compute_targets_use_gamma_and_gae_lambda",)),
    Mutant("ppo-gae-lambda-ignored", "gae_lambda ignored (0.95)", PPO,
           "RolloutBuffer(cfg.gamma, cfg.gae_lambda)", "RolloutBuffer(cfg.gamma, 0.95)",
           (f"{T_PPO}::test_compute_targets_use_gamma_and_gae_lambda",)),
    Mutant("ppo-vf-coef-ignored", "vf_coef ignored (0.5)", PPO, "cfg.vf_coef * v_loss", "0.5 * v_loss",
           (f"{T_PPO}::test_vf_coef_and_ent_coef_weigh_the_total_loss",)),
    Mutant("ppo-ent-coef-sign", "entropy bonus with the wrong sign", PPO,
           "- cfg.ent_coef * ent", "+ cfg.ent_coef * ent",
           (f"{T_PPO}::test_vf_coef_and_ent_coef_weigh_the_total_loss",)),
    Mutant("ppo-epochs-ignored", "epochs ignored (1)", PPO, "range(cfg.epochs)", "range(1)",
           (f"{T_PPO}::test_epochs_and_minibatch_size_set_the_number_of_steps",)),
    Mutant("ppo-minibatch-size-ignored", "minibatch_size ignored (64)", PPO,
           "minibatches(cfg.minibatch_size)", "minibatches(64)",
           (f"{T_PPO}::test_epochs_and_minibatch_size_set_the_number_of_steps",)),
    Mutant("ppo-max-grad-norm-ignored", "max_grad_norm ignored (0.5)", PPO,
           "self.config.max_grad_norm, loss, name=self.loss_name", "0.5, loss, name=self.loss_name",
           (f"{T_PPO}::test_max_grad_norm_clips_the_applied_gradient",)),
    Mutant("ppo-adam-eps-ignored", "adam_eps ignored (1e-8)", PPO,
           "lr=self.config.lr, eps=self.config.adam_eps)", "lr=self.config.lr)",
           (f"{T_PPO}::test_first_step_follows_lr_lr_schedule_and_adam_eps",)),
    # --- every other DQNConfig field
    Mutant("dqn-gamma-ignored", "gamma ignored (0.99)", DQN,
           'mb["terminated"], cfg.gamma)', 'mb["terminated"], 0.99)',
           (f"{T_DQN}::test_gamma_discounts_the_bootstrap",)),
    Mutant("dqn-loss-always-huber", "loss option ignored (always Huber)", DQN,
           'huber(q, y) if cfg.loss == "huber" else F.mse_loss(q, y)', "huber(q, y)",
           (f"{T_DQN}::test_loss_option_picks_huber_or_mse",)),
    Mutant("dqn-lr-not-reapplied", "a changed lr (pickaxe set) never reaches the optimizer", DQN,
           'group["lr"] = cfg.lr', "pass",
           (f"{T_DQN}::test_first_step_follows_lr",)),
    Mutant("dqn-buffer-size-ignored", "buffer_size ignored (100000)", DQN,
           "ReplayBuffer(cfg.buffer_size,", "ReplayBuffer(100_000,",
           (f"{T_DQN}::test_buffer_size_bounds_the_replay_buffer",)),
    Mutant("dqn-batch-size-ignored", "batch_size ignored (64)", DQN,
           "self.buffer.sample(cfg.batch_size)", "self.buffer.sample(64)",
           (f"{T_DQN}::test_gradient_steps_and_batch_size",)),
    Mutant("dqn-learning-starts-off-by-one", "learning_starts compared with <=", DQN,
           "len(self.buffer) < cfg.learning_starts", "len(self.buffer) <= cfg.learning_starts",
           (f"{T_DQN}::test_learning_starts_waits_for_enough_stored_steps",)),
    Mutant("dqn-learning-starts-ignored", "learning_starts ignored", DQN,
           "len(self.buffer) < cfg.learning_starts", "len(self.buffer) < 0",
           (f"{T_DQN}::test_learning_starts_waits_for_enough_stored_steps",)),
    Mutant("dqn-gradient-steps-ignored", "gradient_steps ignored (1)", DQN,
           "range(cfg.gradient_steps)", "range(1)",
           (f"{T_DQN}::test_gradient_steps_and_batch_size",)),
    Mutant("dqn-target-every-ignored", "target_update_every ignored (1000)", DQN,
           "self.num_updates % cfg.target_update_every == 0", "self.num_updates % 1000 == 0",
           (f"{T_DQN}::test_target_update_every_counts_gradient_steps",)),
    Mutant("dqn-target-every-each-step", "target synced every step", DQN,
           "self.num_updates % cfg.target_update_every == 0", "True",
           (f"{T_DQN}::test_target_update_every_counts_gradient_steps",)),
    Mutant("dqn-tau-ignored", "tau ignored (always a hard copy)", DQN,
           "if self.config.tau >= 1.0:", "if True:",
           (f"{T_DQN}::test_polyak_update_moves_the_target_tau_of_the_way",)),
    Mutant("dqn-hard-copy-backwards", "tau = 1 copies the target into the online network", DQN,
           "self.target.load_state_dict(self.qnet.state_dict())", "self.qnet.load_state_dict(self.target.state_dict())",
           (f"{T_DQN}::test_tau_one_copies_the_online_network",)),
    Mutant("dqn-max-grad-norm-ignored", "max_grad_norm ignored (10)", DQN,
           'cfg.max_grad_norm, "td loss"', '10.0, "td loss"',
           (f"{T_DQN}::test_max_grad_norm_clips_the_applied_gradient",)),
    Mutant("dqn-eps-start-ignored", "eps_start ignored (1.0)", DQN,
           "linear_schedule(cfg.eps_start, cfg.eps_end, progress)", "linear_schedule(1.0, cfg.eps_end, progress)",
           (f"{T_DQN}::test_epsilon_decays_over_eps_fraction_of_training",)),
    Mutant("dqn-eps-end-ignored", "eps_end ignored (0.05)", DQN,
           "linear_schedule(cfg.eps_start, cfg.eps_end, progress)", "linear_schedule(cfg.eps_start, 0.05, progress)",
           (f"{T_DQN}::test_epsilon_decays_over_eps_fraction_of_training",)),
    Mutant("dqn-initial-epsilon", "the acting policy starts at epsilon 1, not eps_start", DQN,
           "EpsilonGreedy(qnet, cfg.eps_start)", "EpsilonGreedy(qnet, 1.0)",
           (f"{T_DQN}::test_epsilon_decays_over_eps_fraction_of_training",)),
    # --- a learning signal end to end (the old Pendulum check, return < 0, passed whatever the policy did)
    Mutant("gaussian-logprob-sign", "Gaussian log-likelihood with the wrong sign (PPO unlearns Pendulum)",
           ACTOR_CRITIC, "(-0.5 * z.pow(2) - self.log_std", "(0.5 * z.pow(2) - self.log_std",
           ("tests/test_training.py::test_pendulum_ppo_learns_with_gaussian_actions",)),
    # --- buffers and minibatches
    Mutant("replay-keeps-oldest", "an oversized batch keeps its first items", BUFFERS,
           "flat[-self.capacity :]", "flat[: self.capacity]",
           (f"{T_BUF}::test_replay_keeps_the_newest_when_a_batch_exceeds_capacity",)),
    Mutant("rollout-gamma-lambda-swapped", "RolloutBuffer passes gamma and lambda swapped to gae", BUFFERS,
           "self.gamma,\n            self.gae_lambda,", "self.gae_lambda,\n            self.gamma,",
           (f"{T_BUF}::test_rollout_buffer_uses_its_gamma_and_lambda",)),
    Mutant("minibatches-drop-last-inverted", "drop_last inverted", BATCH,
           "n - n % size if drop_last else n", "n if drop_last else n - n % size",
           (f"{T_BUF}::test_minibatches_sizes_drop_last_and_generator",)),
    Mutant("minibatches-unshuffled", "minibatches ignore the permutation", BATCH,
           "yield batch[perm[start : start + size]]", "yield batch[start : start + size]",
           (f"{T_BUF}::test_minibatches_sizes_drop_last_and_generator",)),
]  # fmt: skip

# --- issue 26, section 7: the newer modules. The first mutant of each block below is a behaviour no test
# guarded before this round; the rest are a realistic sample of one-line bugs (the kill ratio in docs/testing.md).
T_TD3, T_SAC = "tests/test_td3.py", "tests/test_sac.py"
T_CF, T_LPPO, T_DPO = "tests/test_critic_free.py", "tests/test_llm_ppo.py", "tests/test_dpo.py"
T_RM, T_RLHF, T_CORE = "tests/test_reward_model.py", "tests/test_rlhf_core.py", "tests/test_llm_core.py"
T_ARENA, T_ALARMS = "tests/test_arena.py", "tests/test_alarms.py"
T_SEL, T_STATS, T_EST = "tests/test_selection.py", "tests/test_stats.py", "tests/test_eval_estimates.py"
T_DIST, T_DCFG, T_AGENTS = "tests/test_dist_llm.py", "tests/test_dist_config.py", "tests/test_agents.py"
T_PIPE, T_CE, T_RUNS = "tests/test_pipeline.py", "tests/test_checkpoint_eval.py", "tests/test_rlhf_runs.py"
SLOW_OFFPOLICY = (  # the recipes solved, a kill and resume, seeds: ~65 s of the ~75 s of these two files
    f"{T_TD3}::test_pendulum_td3_recipe_solves_pendulum",
    f"{T_SAC}::test_pendulum_sac_recipe_solves_pendulum",
    f"{T_SAC}::test_killed_and_resumed_sac_run_equals_uninterrupted_run",
    f"{T_SAC}::test_discrete_sac_improves_on_cartpole",
    f"{T_SAC}::test_same_seed_same_metrics_and_another_seed_differs",
)
OFFPOLICY_TESTS = (T_TD3, T_SAC, *(f"--deselect={t}" for t in SLOW_OFFPOLICY))
T_LT = "tests/test_llm_training.py"
LLM_ALGO_TESTS = (
    T_CORE,
    T_RLHF,
    T_CF,
    T_LPPO,
    T_DPO,
    T_RM,
    f"{T_LT}::test_grpo_gradient_accumulation_invariance",
    f"{T_LT}::test_grpo_variants_update",
    f"{T_LT}::test_grpo_logs_checks_and_stays_quiet_on_policy",
)
EVAL_TESTS = (T_ARENA, T_ALARMS, T_SEL, T_STATS, T_EST, f"{T_CORE}::test_pass_at_k_and_wilson")
DIST_TESTS = (f"{T_DIST}::test_an_engine_worker_reloads_its_weights_after_a_state_restore", T_DCFG)
ROLLOUT_TESTS = (
    T_AGENTS,
    f"{T_DIST}::test_async_drops_and_regenerates_a_batch_behind_the_bound",
    f"{T_DIST}::test_async_keeps_a_batch_exactly_at_the_staleness_bound",
    f"{T_DIST}::test_pipelined_batch_k_is_generated_by_version_k_minus_the_staleness",
    f"{T_DIST}::test_scheduler_state_holds_the_batches_in_flight_and_their_prompts",
    f"{T_DIST}::test_only_async_lets_workers_take_newer_weights",
)
EXP_TESTS = (
    T_PIPE,
    f"--deselect={T_PIPE}::test_pipeline_resumes_a_killed_stage",
    T_CE,  # that one trains 2 stages
    f"{T_RUNS}::test_a_resume_refuses_when_a_recorded_input_is_gone_or_changed",
)

NEWER = [
    # --- off-policy: SAC, TD3/DDPG and their shared Polyak update
    Mutant("td3-target-action-online", "TD3/DDPG's target action taken from the online actor", TD3,
           "next_a = self.actor_target(next_obs)", "next_a = self.actor(next_obs)",
           (f"{T_TD3}::test_the_target_action_comes_from_the_target_actor",)),
    Mutant("sac-polyak-backwards", "SAC's Polyak update pulls the critics towards the targets", SAC,
           "polyak(self.target, self.critic, cfg.tau)", "polyak(self.critic, self.target, cfg.tau)",
           (f"{T_SAC}::test_polyak_moves_the_target_critics_tau_of_the_way_to_the_online_ones",)),
    Mutant("td3-polyak-backwards", "TD3's Polyak update pulls the critics towards the targets", TD3,
           "polyak(self.critic_target, self.critic, cfg.tau)", "polyak(self.critic, self.critic_target, cfg.tau)",
           (f"{T_TD3}::test_polyak_moves_both_targets_tau_of_the_way_to_the_online_networks",)),
    Mutant("polyak-lerp-swapped", "polyak() lerps the online networks towards the targets", CONT,
           "torch._foreach_lerp_(t, o, tau)", "torch._foreach_lerp_(o, t, tau)", OFFPOLICY_TESTS),
    Mutant("polyak-tau-one-ignored", "polyak() with tau 1 lerps instead of copying (the same numbers)", CONT,
           "if tau >= 1.0:", "if tau > 1.0:", OFFPOLICY_TESTS),
    Mutant("td3-target-noise-clip", "TD3 clips the smoothing noise at target_noise, not target_noise_clip", TD3,
           "smoothed_target_action(next_a, noise, cfg.target_noise_clip)",
           "smoothed_target_action(next_a, noise, cfg.target_noise)", OFFPOLICY_TESTS),
    Mutant("td3-policy-delay-off-by-one", "TD3's delayed actor step one update early", TD3,
           "(self.num_updates + 1) % cfg.policy_delay == 0", "self.num_updates % cfg.policy_delay == 0",
           OFFPOLICY_TESTS),
    Mutant("td3-critic-lr-ignored", "TD3's critic steps at lr, not critic_lr", TD3,
           'self.optimizer.param_groups[0]["lr"] = cfg.critic_lr or cfg.lr',
           'self.optimizer.param_groups[0]["lr"] = cfg.lr', OFFPOLICY_TESTS),
    Mutant("sac-critic-lr-ignored", "SAC's critic steps at lr, not critic_lr", SAC,
           'groups[0]["lr"] = cfg.critic_lr or cfg.lr', 'groups[0]["lr"] = cfg.lr', OFFPOLICY_TESTS),
    Mutant("sac-soft-value-sign", "SAC's soft value adds the entropy term with the wrong sign", SAC,
           "soft_value = next_q.min(dim=0).values - alpha * next_logprob",
           "soft_value = next_q.min(dim=0).values + alpha * next_logprob", OFFPOLICY_TESTS),
    Mutant("sac-target-entropy-scale-ignored", "discrete SAC ignores target_entropy_scale (0.89)", SAC,
           "default_target_entropy(action_space, cfg.target_entropy_scale)", "default_target_entropy(action_space)",
           OFFPOLICY_TESTS),
    Mutant("sac-metrics-summed", "SAC's metrics summed over gradient steps, not averaged", SAC,
           "mean = totals / cfg.gradient_steps", "mean = totals", OFFPOLICY_TESTS),
    Mutant("td3-ddpg-two-critics", "DDPG gets twin critics", TD3,
           "2 if config.twin else 1", "2", OFFPOLICY_TESTS),
    Mutant("td3-exploration-unclipped", "TD3's exploration noise pushes actions out of bounds", TD3,
           "a = (a + self.noise * torch.randn_like(a)).clamp(-1.0, 1.0)", "a = a + self.noise * torch.randn_like(a)",
           OFFPOLICY_TESTS),
    Mutant("sac-random-past-learning-starts", "SAC acts at random one step past learning_starts", SAC,
           "self.policy.random = step < self.config.learning_starts",
           "self.policy.random = step <= self.config.learning_starts", OFFPOLICY_TESTS),
    # --- LLM algorithms: LLM PPO, GRPO, DPO, the reward model, the RLHF loss pieces
    Mutant("grpo-dr-scaled", "Dr. GRPO's unscaled advantages still divided by the group std", GRPO,
           "return group_advantages(reward, group, cfg.scale_rewards), metrics",
           "return group_advantages(reward, group), metrics",
           (f"{T_CF}::test_dr_grpo_advantages_are_centred_and_never_divided_by_the_group_std",)),
    Mutant("llm-ppo-critic-lr-unscheduled", "the LLM critic's lr ignores the policy's warm-up and schedule", LLM_PPO,
           "return base * policy_lr / cfg.lr", "return base",
           (f"{T_LPPO}::test_the_critic_lr_follows_the_policys_warmup_and_schedule",)),
    Mutant("llm-ppo-critic-lr-ignored", "critic_lr ignored (the critic steps at lr)", LLM_PPO,
           "base = cfg.lr if cfg.critic_lr is None else cfg.critic_lr", "base = cfg.lr", LLM_ALGO_TESTS),
    Mutant("llm-ppo-gamma-lam-swapped", "LLM PPO passes gamma and lam swapped to GAE", LLM_PPO,
           "token_gae(token_reward, old_values, m, cfg.gamma, cfg.lam)",
           "token_gae(token_reward, old_values, m, cfg.lam, cfg.gamma)", LLM_ALGO_TESTS),
    Mutant("llm-ppo-kl-in-loss-shapes-reward", "kl_in=loss also shapes the reward", LLM_PPO,
           'coef = cfg.kl_coef if cfg.kl_in == "reward" else 0.0', "coef = cfg.kl_coef", LLM_ALGO_TESTS),
    Mutant("llm-ppo-value-clip-dropped", "value_clip never reaches the critic's loss", LLM_PPO,
           "token_value_loss(values, old_values, returns, mask, cfg.value_clip)",
           "token_value_loss(values, old_values, returns, mask)", LLM_ALGO_TESTS),
    Mutant("llm-ppo-critic-max-norm", "the critic clipped at the policy's max_grad_norm", LLM_PPO,
           "(cfg.max_grad_norm, cfg.critic_max_grad_norm)", "(cfg.max_grad_norm, cfg.max_grad_norm)",
           LLM_ALGO_TESTS),
    Mutant("llm-ppo-whiten-inverted", "whiten_advantages inverted", LLM_PPO,
           "if cfg.whiten_advantages:", "if not cfg.whiten_advantages:", LLM_ALGO_TESTS),
    Mutant("grpo-clip-high-ignored", "GRPO clips above at clip_low (DAPO's clip-higher ignored)", GRPO,
           "advantage, cfg.clip_low, cfg.clip_high", "advantage, cfg.clip_low, cfg.clip_low", LLM_ALGO_TESTS),
    Mutant("grpo-kl-loss-always", "GRPO adds the KL loss term with kl_in=reward too", GRPO,
           'if cfg.kl_coef > 0 and cfg.kl_in == "loss":\n        kl = kl_estimate(',
           "if cfg.kl_coef > 0:\n        kl = kl_estimate(", LLM_ALGO_TESTS),
    Mutant("grpo-dynamic-sampling-inverted", "dynamic sampling keeps only the zero-variance groups", GRPO,
           "keep = ~zero_variance_groups(", "keep = zero_variance_groups(", LLM_ALGO_TESTS),
    Mutant("grpo-tis-weight-ignored", "the truncated importance weight never reaches the loss", GRPO,
           "pg = pg * masked(tis_weight, mask)", "pg = pg", LLM_ALGO_TESTS),
    Mutant("bt-margin-sign", "the Bradley-Terry margin added instead of subtracted", RLHF,
           "diff = diff - margin", "diff = diff + margin", LLM_ALGO_TESTS),
    Mutant("cdpo-smoothing-sign", "cDPO's flipped-label term with the wrong sign inside", RLHF,
           "label_smoothing * F.logsigmoid(-beta * h)", "label_smoothing * F.logsigmoid(beta * h)", LLM_ALGO_TESTS),
    Mutant("ipo-target", "IPO regresses the gap to 1/beta instead of 1/(2 beta)", RLHF,
           "per_pair = (h - 1.0 / (2.0 * beta)).pow(2)", "per_pair = (h - 1.0 / beta).pow(2)", LLM_ALGO_TESTS),
    Mutant("rloo-baseline-includes-self", "RLOO's baseline divides by n, not n - 1", RLHF,
           "baseline = (total - r) / (count - 1).clamp(min=1)", "baseline = (total - r) / count", LLM_ALGO_TESTS),
    Mutant("token-returns-gamma-ignored", "token_returns ignores gamma", RLHF,
           "running = torch.where(m[:, t], r[:, t] + gamma * running, running)",
           "running = torch.where(m[:, t], r[:, t] + running, running)", LLM_ALGO_TESTS),
    Mutant("token-gae-lam-ignored", "token GAE ignores lambda", RLHF,
           "adv = delta + gamma * lam * next_adv", "adv = delta + gamma * next_adv", LLM_ALGO_TESTS),
    Mutant("whiten-shift-mean-inverted", "whiten's shift_mean inverted", RLHF,
           "if not shift_mean:", "if shift_mean:", LLM_ALGO_TESTS),
    Mutant("kl-shaped-reward-at-first-token", "the sequence reward placed at the first response token", RLHF,
           "last = width - 1 - m.long().flip(-1).argmax(-1)", "last = m.long().argmax(-1)", LLM_ALGO_TESTS),
    Mutant("reinforce-pp-scale-inverted", "REINFORCE++ whitening's scale flag inverted", RLHF,
           "    if scale:\n        advantage = whiten(returns, mask)",
           "    if not scale:\n        advantage = whiten(returns, mask)", LLM_ALGO_TESTS),
    Mutant("dpo-ipo-counts-swapped", "IPO divides each response by the other's token count", DPO,
           "pi_c, pi_r = pi_c / counts[:, 0], pi_r / counts[:, 1]",
           "pi_c, pi_r = pi_c / counts[:, 1], pi_r / counts[:, 0]", LLM_ALGO_TESTS),
    Mutant("dpo-cache-slot", "the reference cache stores later pairs at rows 0.. (overwriting the first)", DPO,
           "self._slots[pid] = start + j", "self._slots[pid] = j", LLM_ALGO_TESTS),
    Mutant("dpo-beta-ignored", "DPO's beta ignored (0.1)", DPO,
           "cfg.beta, cfg.loss, cfg.label_smoothing", "0.1, cfg.loss, cfg.label_smoothing", LLM_ALGO_TESTS),
    Mutant("dpo-label-smoothing-ignored", "cDPO's label_smoothing ignored", DPO,
           "cfg.beta, cfg.loss, cfg.label_smoothing", "cfg.beta, cfg.loss, 0.0", LLM_ALGO_TESTS),
    Mutant("rm-config-margin-dropped", "the config's margin dropped when the batch has per-pair margins", RM,
           "margins[torch.tensor(idx, device=self.device)] + cfg.margin",
           "margins[torch.tensor(idx, device=self.device)]", LLM_ALGO_TESTS),
    Mutant("rm-eval-ties-count", "reward-model accuracy counts ties as right", RM,
           "correct + (scores[:k] > scores[k:]).sum()", "correct + (scores[:k] >= scores[k:]).sum()",
           LLM_ALGO_TESTS),
    Mutant("rm-micro-batch-normalised", "the reward-model loss normalised per micro-batch", RM,
           "total_pairs=float(n))", "total_pairs=float(k))", LLM_ALGO_TESTS),
    Mutant("rm-scores-before-last-token", "the reward model scores the token before the last", RM,
           "[[n - 1] if n > 1 else []", "[[n - 2] if n > 2 else []", LLM_ALGO_TESTS),
    # --- eval: arena, alarms, selection, stats
    Mutant("arena-interval-level", "arena intervals at another level than the one labelled", ARENA,
           "alpha = (1.0 - confidence) / 2.0", "alpha = 1.0 - confidence",
           (f"{T_ARENA}::test_bootstrap_intervals_are_at_the_labelled_level",)),
    Mutant("alarms-stale-evaluation", "a monitor resumed from an older checkpoint keeps the stale evaluation",
           ALARMS, 'if h["step"] < step]', 'if h["step"] <= step]',
           (f"{T_ALARMS}::test_a_monitor_resumed_from_an_older_checkpoint_forgets_the_evaluations_from_that_step_on",)),
    Mutant("arena-confidence-default", "bootstrap_ci's default level 90%", ARENA,
           "    confidence: float = 0.95,\n    prior", "    confidence: float = 0.9,\n    prior", EVAL_TESTS),
    Mutant("arena-tie-as-loss", "a tie counted as a loss for the left side", ARENA,
           '.get(v.choice, 0.5)', '.get(v.choice, 0.0)', EVAL_TESTS),
    Mutant("arena-more-votes-ignores-votes", "votes_to_separate ignores the votes so far", ARENA,
           "max(0, math.ceil(needed - n))", "max(0, math.ceil(needed))", EVAL_TESTS),
    Mutant("arena-loss-counted-as-tie", "a right-side loss counted as a tie", ARENA,
           "counts[v.right][1] += 1", "counts[v.right][2] += 1", EVAL_TESTS),
    Mutant("alarms-same-step-kept", "re-evaluating the last step seen keeps the old evaluation", ALARMS,
           'if self._history and step <= self._history[-1]["step"]',
           'if self._history and step < self._history[-1]["step"]', EVAL_TESTS),
    Mutant("alarms-ci-full-width", "the gold-drop test uses whole CI widths, not half-widths", ALARMS,
           "math.hypot((ph - pl) / 2, (nh - nl) / 2)", "math.hypot(ph - pl, nh - nl)", EVAL_TESTS),
    Mutant("alarms-drift-one-sided", "drift alarms see only upward drift", ALARMS,
           "if abs(rel) <= drift:", "if rel <= drift:", EVAL_TESTS),
    Mutant("alarms-fit-points-off-by-one", "the Gao fit waits for one evaluation more than fit_points", ALARMS,
           "< self.cfg.fit_points:", "<= self.cfg.fit_points:", EVAL_TESTS),
    Mutant("alarms-saturation-needs-no-rise", "saturation fires without a rise", ALARMS,
           "if rise <= 0 or spread > tol * rise:", "if spread > tol * rise:", EVAL_TESTS),
    Mutant("selection-ties-to-later", "selection ties go to the later step", SELECTION,
           "return max(pool, key=lambda c: (key(c), -c.step))", "return max(pool, key=lambda c: (key(c), c.step))",
           EVAL_TESTS),
    Mutant("selection-mode-min-ignored", "mode=min selects the highest value", SELECTION,
           'sign = 1.0 if cfg.mode == "max" else -1.0', "sign = 1.0", EVAL_TESTS),
    Mutant("selection-max-lower-uses-high", "max-lower takes the optimistic CI end", SELECTION,
           "pick = best_of(cs, lambda c: bounds(c)[0])", "pick = best_of(cs, lambda c: bounds(c)[1])", EVAL_TESTS),
    Mutant("selection-first-record-wins", "a re-evaluated step keeps its first record", SELECTION,
           "by_step[step] = Candidate(step, mean, low, high)",
           "by_step.setdefault(step, Candidate(step, mean, low, high))", EVAL_TESTS),
    Mutant("selection-explicit-metric-falls-back", "an unlogged explicit metric falls back to the defaults",
           SELECTION, "return cfg.metric if cfg.metric in present else None",
           "return cfg.metric if cfg.metric in present else next((m for m in METRICS if m in present), None)",
           EVAL_TESTS),
    Mutant("stats-percentile-alpha", "bootstrap percentiles at alpha, not alpha/2", STATS,
           "np.quantile(samples, [alpha / 2, 1 - alpha / 2])", "np.quantile(samples, [alpha, 1 - alpha])",
           EVAL_TESTS),
    Mutant("stats-poi-ties-count-whole", "probability of improvement counts ties as wins", STATS,
           "+ 0.5 * (xi == yi).mean(axis=(1, 2))", "+ (xi == yi).mean(axis=(1, 2))", EVAL_TESTS),
    Mutant("stats-pass-at-k-off-by-one", "pass@k's product starts one term early", STATS,
           "np.arange(n - c + 1, n + 1)", "np.arange(n - c, n + 1)", EVAL_TESTS),
    Mutant("stats-wilson-centre", "Wilson interval's centre shifted by z^2/n", STATS,
           "center = (p + z * z / (2 * n)) / denom", "center = (p + z * z / n) / denom", EVAL_TESTS),
    Mutant("stats-paired-variance-biased", "samples_to_separate uses the biased variance (paired)", STATS,
           "float(diff.var(ddof=1))", "float(diff.var())", EVAL_TESTS),
    Mutant("stats-iqm-cut-rounded", "IQM rounds the cut instead of flooring it", STATS,
           "cut = int(0.25 * n)", "cut = round(0.25 * n)", EVAL_TESTS),
    # --- dist: engine workers, the weight board, learners, Ray jobs
    Mutant("engine-worker-keeps-weights", "an engine worker keeps its loaded weights across a state restore",
           WORKER, "            self.engine.load_state_dict(state)\n        self.loaded = None",
           "            self.engine.load_state_dict(state)",
           (f"{T_DIST}::test_an_engine_worker_reloads_its_weights_after_a_state_restore",)),
    Mutant("engine-worker-reloads-every-call", "an engine worker never records what it loaded", WORKER,
           "            self.loaded = version\n", "", DIST_TESTS),
    Mutant("engine-worker-older-board", "a worker takes the board's version even when older", WORKER,
           "if newest > version:", "if newest != version:", DIST_TESTS),
    Mutant("weight-board-older-post", "the weight board takes an older version posted late", WORKER,
           "if version > self.version:", "if version >= self.version - 1:", DIST_TESTS),
    Mutant("trainable-weights-frozen", "published weights include frozen parameters", ENGINES,
           "for name, p in model.named_parameters() if p.requires_grad}", "for name, p in model.named_parameters()}",
           DIST_TESTS),
    Mutant("jobs-capacity-max", "Ray job capacity from the most plentiful resource", JOBS,
           "return max(1, int(min(fits))) if fits else 1 << 30", "return max(1, int(max(fits))) if fits else 1 << 30",
           DIST_TESTS),
    Mutant("jobs-capacity-gpus-unchecked", "a job needing more GPUs than the cluster has is not refused", JOBS,
           "if cpus > have_cpus or gpus > have_gpus:", "if cpus > have_cpus:", DIST_TESTS),
    Mutant("learners-torchrun-mismatch", "torchrun with fewer processes than --dist.learners passes", LEARNERS,
           "if world > 1 and world != learners:", "if world > learners:", DIST_TESTS),
    Mutant("follower-warm-starts", "a follower learner runs the SFT warm start too", LEARNERS,
           "cfg.warm_start.updates = 0", "cfg.warm_start.updates = cfg.warm_start.updates", DIST_TESTS),
    Mutant("follower-evaluates-before", "a follower learner evaluates before training", LEARNERS,
           "cfg.eval.before = False", "cfg.eval.before = cfg.eval.before", DIST_TESTS),
    Mutant("data-parallel-gloo-on-cuda", "CUDA learners get the gloo backend", DATA_PARALLEL,
           '"nccl" if torch.device(device).type == "cuda" else "gloo"', '"gloo"', DIST_TESTS),
    Mutant("data-parallel-world-of-one", "WORLD_SIZE=1 asks for a process group", DATA_PARALLEL,
           "    if world <= 1:\n        return False", "    if world < 1:\n        return False", DIST_TESTS),
    # --- rollout: agent episodes and the pipelined/async scheduler
    Mutant("agent-version-newest", "an agent episode carries its newest turn's policy version", AGENT,
           "min(t.version, c.version)", "max(t.version, c.version)",
           (f"{T_AGENTS}::test_an_episode_carries_the_oldest_policy_version_of_its_turns",)),
    Mutant("staleness-off-by-one", "async drops a batch exactly at the staleness bound", SCHED,
           "learner - oldest <= self.max_staleness", "learner - oldest < self.max_staleness",
           (f"{T_DIST}::test_async_keeps_a_batch_exactly_at_the_staleness_bound",)),
    Mutant("scheduler-one-batch-short", "pipelined mode keeps one batch fewer in flight", SCHED,
           "while len(self.queue) <= self.max_staleness:", "while len(self.queue) < self.max_staleness:",
           ROLLOUT_TESTS),
    Mutant("scheduler-resubmits-at-the-back", "a dropped batch is regenerated behind the others", SCHED,
           "self._submit(batch, front=True)", "self._submit(batch)", ROLLOUT_TESTS),
    Mutant("scheduler-newest-in-pipelined", "pipelined mode lets workers take newer weights", SCHED,
           'newest=self.mode == "async"', "newest=True", ROLLOUT_TESTS),
    Mutant("agent-results-misrouted", "every episode reads the first episode's tool results", AGENT,
           "mine = results[k : k + len(turn.calls)]", "mine = results[: len(turn.calls)]", ROLLOUT_TESTS),
    Mutant("agent-tool-errors-inverted", "tool errors count the successful calls", AGENT,
           "t.tool_errors += sum(not r.ok for r in mine)", "t.tool_errors += sum(r.ok for r in mine)",
           ROLLOUT_TESTS),
    Mutant("agent-last-turn-calls-run", "the last turn's tool calls run although no turn follows", AGENT,
           "elif round_ == self.env.max_turns:", "elif round_ > self.env.max_turns:", ROLLOUT_TESTS),
    Mutant("agent-turn-past-budget", "a turn's tokens are not cut at the trajectory budget", AGENT,
           "ids, logps = list(c.token_ids)[:room], list(c.logprobs)[:room]",
           "ids, logps = list(c.token_ids), list(c.logprobs)", ROLLOUT_TESTS),
    Mutant("agent-eos-text-always-dropped", "the template's EOS text dropped after a turn without EOS", AGENT,
           "if ended_with_eos and self._eos_text and end.startswith(self._eos_text):",
           "if self._eos_text and end.startswith(self._eos_text):", ROLLOUT_TESTS),
    Mutant("agent-budget-off-by-one", "an observation that fills the budget exactly still gets a turn", AGENT,
           "if len(t.tokens) + len(appended) >= self.env.max_tokens:",
           "if len(t.tokens) + len(appended) > self.env.max_tokens:", ROLLOUT_TESTS),
    # --- exp: pipelines, pickaxe eval --checkpoints, resume checks of LLM runs
    Mutant("pipeline-later-dependency", "a pipeline stage may depend on a later stage", PIPELINE,
           "missing = [d for d in s.depends_on if d not in seen]",
           "missing = [d for d in s.depends_on if d not in {t.name for t in stages}]",
           (f"{T_PIPE}::test_a_stage_may_depend_only_on_earlier_stages",)),
    Mutant("resume-input-gone", "a resume passes when a recorded input file is gone", LLM_RUNS,
           "if now.get(key) != digest:", "if key in now and now[key] != digest:",
           (f"{T_RUNS}::test_a_resume_refuses_when_a_recorded_input_is_gone_or_changed",)),
    Mutant("ckpt-eval-cache-ignores-config", "the checkpoint-eval cache ignores the run's config", CKPT_EVAL,
           "settings_hash(evaluator.kind, evaluator.settings, cfg.to_dict())",
           "settings_hash(evaluator.kind, evaluator.settings, {})",
           (f"{T_CE}::test_the_cache_is_keyed_by_the_runs_settings",)),
    Mutant("ckpt-eval-cache-ignores-episodes", "the cache key leaves out --episodes", CKPT_EVAL,
           'self.settings = {"episodes": self.episodes, "device": cfg.device}',
           'self.settings = {"device": cfg.device}', EXP_TESTS),
    Mutant("ckpt-eval-no-cache-ignored", "--no-cache still reads the cache", CKPT_EVAL,
           "hit = _read_cache(path, ref) if cache else None", "hit = _read_cache(path, ref)", EXP_TESTS),
    Mutant("ckpt-eval-latest-is-first", "--checkpoints latest picks the earliest step", CKPT_EVAL,
           "steps.append(refs[-1].step)", "steps.append(refs[0].step)", EXP_TESTS),
    Mutant("ckpt-eval-best-without-weights", "best may name a step whose weights were not kept", CKPT_EVAL,
           'records = [r for r in records if r["step"] in kept]', "records = list(records)", EXP_TESTS),
    Mutant("ckpt-eval-best-logged-first", "best prefers the run's logged evaluations to --checkpoints results",
           CKPT_EVAL, "for records in (_results_records(run_dir), _eval_records(run_dir)):",
           "for records in (_eval_records(run_dir), _results_records(run_dir)):", EXP_TESTS),
    Mutant("ckpt-eval-pairs-mode-ignored", "the top pair ranks by the highest mean under mode=min", CKPT_EVAL,
           '    sign = 1.0 if select.mode == "max" else -1.0\n    ranked', "    sign = 1.0\n    ranked", EXP_TESTS),
    Mutant("pipeline-run-dir-flag-allowed", "an extra --run-dir is passed to every stage", PIPELINE,
           'if key in ("seed", "run_dir"):', 'if key in ("seed",):', EXP_TESTS),
    Mutant("pipeline-summary-any", "the pipeline exits 0 when any stage succeeded", PIPELINE,
           "return SUCCEEDED if all(state", "return SUCCEEDED if any(state", EXP_TESTS),
    Mutant("pipeline-blocked-not-transitive", "a blocked stage names its blocked dependency, not the cause",
           PIPELINE, "            return _blocked_by(queue, d, names)\n",
           "            return f\"stage {d.name} blocked\"\n",
           EXP_TESTS),
    Mutant("pipeline-spec-ignores-extra", "the default folder ignores the extra train flags", PIPELINE,
           '"extra": list(extra),', '"extra": [],', EXP_TESTS),
]  # fmt: skip
MUTANTS += NEWER


AREAS = {
    "offpolicy": ("algos/sac.py", "algos/td3.py", "models/continuous.py"),
    "llm-algos": ("algos/llm_ppo.py", "algos/grpo.py", "algos/dpo.py", "algos/reward_model.py", "algos/rlhf_core.py"),
    "eval": ("eval/",),
    "dist": ("dist/",),
    "agent": ("rollout/agent.py", "rollout/pipelined.py"),
    "exp": ("exp/", "train/llm.py"),
}
"""The areas of the newer modules the kill ratio is reported for (mutants elsewhere: ``classic``)."""


def area(m: Mutant) -> str:
    """The area of ``m``'s file (see :data:`AREAS`)."""
    path = m.path.removeprefix("src/pickaxe/")
    return next((a for a, prefixes in AREAS.items() if path.startswith(prefixes)), "classic")


def run_tests(src: Path, tests: tuple[str, ...]) -> int:
    """Exit status of pytest on ``tests`` with the package imported from ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def markdown() -> str:
    """The mutant -> test table."""
    rows = ["| mutant | bug | file | caught by |", "|---|---|---|---|"]
    for m in MUTANTS:
        tests = ", ".join(f"`{t.split('/')[-1]}`" for t in m.tests if not t.startswith("--"))
        rows.append(f"| `{m.name}` | {m.what} | `{m.path.removeprefix('src/')}` | {tests} |")
    return "\n".join(rows)


def main() -> int:
    """Apply each selected mutant to a copy of ``src/``, run its tests, report caught/survived."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutant names or prefixes (default: all)")
    parser.add_argument("--markdown", action="store_true", help="print the mutant -> test table and exit")
    parser.add_argument("--area", choices=[*AREAS, "classic"], help="only the mutants of this area")
    args = parser.parse_args()
    if args.markdown:
        print(markdown())
        return 0
    chosen = [m for m in MUTANTS if not args.names or any(m.name.startswith(n) for n in args.names)]
    chosen = [m for m in chosen if args.area is None or area(m) == args.area]
    with tempfile.TemporaryDirectory(prefix="pickaxe-named-mutants-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        baseline = sorted({t for m in chosen for t in m.tests})
        if run_tests(src, tuple(baseline)) != 0:
            print("baseline failed: the tests must pass on the unmutated source first", file=sys.stderr)
            return 2
        survived = []
        for m in chosen:
            target = src / m.path.removeprefix("src/")
            original = target.read_text()
            if original.count(m.old) != 1:
                print(f"{m.name:36s} STALE (the text to mutate occurs {original.count(m.old)} times)")
                survived.append(m.name)
                continue
            target.write_text(original.replace(m.old, m.new))
            try:
                caught = run_tests(src, m.tests) != 0
            finally:
                target.write_text(original)
            print(f"{m.name:36s} {'caught' if caught else 'SURVIVED'}", flush=True)
            if not caught:
                survived.append(m.name)
    for name in dict.fromkeys(area(m) for m in chosen):
        mine = [m for m in chosen if area(m) == name]
        caught = sum(m.name not in survived for m in mine)
        print(f"{name}: {caught}/{len(mine)} caught ({100 * caught / len(mine):.0f}%)")
    print(f"{len(chosen) - len(survived)}/{len(chosen)} caught" + (f"; not caught: {survived}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
