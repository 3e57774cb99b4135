"""Hand-written single-bug mutants of PPO, DQN, the buffers and the loss pieces, each with the test that must catch it.

Each mutant is applied to a copy of ``src/`` in a temporary folder (the working tree is never touched), the
named tests run against that copy (``PYTHONPATH`` puts it ahead of the editable install), and the mutant is
*caught* when they fail. A baseline run without any mutant must pass first.

    .venv/bin/python tests/mutation/named_mutants.py            # all; exit 1 if one survives
    .venv/bin/python tests/mutation/named_mutants.py dqn-double  # by name (prefixes work)
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
           'float(history[-1]["ppo/approx_kl"])', 'float(history[0]["ppo/approx_kl"])',
           (f"{T_PPO}::test_target_kl_stops_the_epochs_early",)),
    Mutant("ppo-target-kl-inverted", "target_kl comparison inverted", PPO,
           '["ppo/approx_kl"]) > cfg.target_kl', '["ppo/approx_kl"]) < cfg.target_kl',
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
           'cfg.max_grad_norm, "ppo loss"', '0.5, "ppo loss"',
           (f"{T_PPO}::test_max_grad_norm_clips_the_applied_gradient",)),
    Mutant("ppo-adam-eps-ignored", "adam_eps ignored (1e-8)", PPO,
           "lr=cfg.lr, eps=cfg.adam_eps)", "lr=cfg.lr)",
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


def run_tests(src: Path, tests: tuple[str, ...]) -> int:
    """Exit status of pytest on ``tests`` with the package imported from ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def markdown() -> str:
    """The mutant -> test table."""
    rows = ["| mutant | bug | file | caught by |", "|---|---|---|---|"]
    for m in MUTANTS:
        tests = ", ".join(f"`{t.split('/')[-1]}`" for t in m.tests)
        rows.append(f"| `{m.name}` | {m.what} | `{m.path.removeprefix('src/')}` | {tests} |")
    return "\n".join(rows)


def main() -> int:
    """Apply each selected mutant to a copy of ``src/``, run its tests, report caught/survived."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutant names or prefixes (default: all)")
    parser.add_argument("--markdown", action="store_true", help="print the mutant -> test table and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown())
        return 0
    chosen = [m for m in MUTANTS if not args.names or any(m.name.startswith(n) for n in args.names)]
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
    print(f"{len(chosen) - len(survived)}/{len(chosen)} caught" + (f"; not caught: {survived}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
