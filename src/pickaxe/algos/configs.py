"""What each algorithm can be told: the config dataclasses of PPO, DQN, SFT and GRPO (the last two
share ``LMConfig``).

They live apart from the algorithms so that reading, checking and changing a config (``pickaxe recipes``,
``pickaxe set``, ``config.json``) never imports torch. Each field declares its valid range next to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pickaxe.config_keys import ranged, validate

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""How per-token losses become one number (see ``pickaxe.algos.llm_core.aggregate``)."""
KLEstimator = Literal["k1", "k2", "k3"]
"""Schulman's estimators of KL(policy || reference) from sampled tokens."""


@dataclass
class PPOConfig:
    """Proximal Policy Optimization: clipped surrogate and GAE on an actor-critic (Discrete, Box, MultiDiscrete or
    MultiBinary actions), with optional observation and reward normalisation."""

    mutable: ClassVar[tuple[str, ...]] = (
        "lr", "clip", "ent_coef", "vf_coef", "max_grad_norm", "target_kl", "epochs", "minibatch_size",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(3e-4, gt=0, le=10)
    lr_schedule: Literal["constant", "linear"] = "constant"
    gamma: float = ranged(0.99, ge=0, le=1)
    gae_lambda: float = ranged(0.95, ge=0, le=1)
    clip: float = ranged(0.2, gt=0, le=10)
    clip_schedule: Literal["constant", "linear"] = "constant"
    value_clip: float | None = ranged(None, gt=0)
    """Clip the value update around the old value by this much (None: no value clipping)."""
    vf_coef: float = ranged(0.5, ge=0)
    ent_coef: float = ranged(0.0, ge=0)
    epochs: int = ranged(10, ge=1, le=10_000)
    minibatch_size: int = ranged(64, ge=1)
    max_grad_norm: float = ranged(0.5, gt=0)
    normalize_advantage: bool = True
    target_kl: float | None = ranged(None, gt=0)
    """Stop the epochs of an update early once the approximate KL exceeds this."""
    adam_eps: float = ranged(1e-5, gt=0)
    normalize_obs: bool = False
    """Normalise observations by their running mean and std (updated once per collect, kept in the model)."""
    obs_clip: float = ranged(10.0, gt=0)
    """Normalised observations are clipped to [-obs_clip, obs_clip]."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (as SB3's VecNormalize); logged returns stay raw."""
    reward_clip: float = ranged(10.0, gt=0)
    """Scaled rewards are clipped to [-reward_clip, reward_clip]."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class RecurrentPPOConfig(PPOConfig):
    """Recurrent PPO: an LSTM policy trained on fixed-length chunks of each env's rollout (truncated BPTT)."""

    lstm: int = ranged(64, ge=1, le=65_536)
    """LSTM units (the actor and critic heads share the LSTM, on top of the model's MLP torso; with returns much
    larger than 1 the value loss dominates that shared gradient: turn normalize_reward on, or separate_critic)."""
    separate_critic: bool = False
    """Give the critic its own encoder, torso and LSTM (Stable-Baselines3's default): the value loss no longer
    reaches the actor's weights; twice the network."""
    seq_len: int = ranged(16, ge=1, le=65_536)
    """Steps per training sequence; each starts from the hidden state the collector had there."""
    minibatch_size: int = ranged(256, ge=1)
    """Steps per minibatch (whole sequences: rounded to a multiple of seq_len, at least one)."""


@dataclass
class A2CConfig:
    """Advantage actor-critic (synchronous A3C): one gradient step per rollout on n-step advantages; the defaults
    are Stable-Baselines3's A2C."""

    mutable: ClassVar[tuple[str, ...]] = ("lr", "ent_coef", "vf_coef", "max_grad_norm")
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(7e-4, gt=0, le=10)
    lr_schedule: Literal["constant", "linear"] = "constant"
    gamma: float = ranged(0.99, ge=0, le=1)
    gae_lambda: float = ranged(1.0, ge=0, le=1)
    """1.0: plain n-step returns (A2C); lower values are GAE."""
    vf_coef: float = ranged(0.5, ge=0)
    ent_coef: float = ranged(0.0, ge=0)
    max_grad_norm: float = ranged(0.5, gt=0)
    normalize_advantage: bool = False
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """rmsprop: torch RMSprop with alpha and eps as below (SB3's default); adam: fused Adam."""
    rms_alpha: float = ranged(0.99, gt=0, lt=1)
    eps: float = ranged(1e-5, gt=0)
    """The optimizer's epsilon."""
    normalize_obs: bool = False
    """Normalise observations by their running mean and std (updated once per collect, kept in the model)."""
    obs_clip: float = ranged(10.0, gt=0)
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return; logged returns stay raw."""
    reward_clip: float = ranged(10.0, gt=0)

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class DQNConfig:
    """Deep Q-learning with a target network and double-DQN targets; Rainbow's parts are options: n-step returns,
    prioritized replay, dueling heads, C51 or QR distributional heads, noisy nets."""

    mutable: ClassVar[tuple[str, ...]] = (
        "lr", "gradient_steps", "batch_size", "target_update_every", "max_grad_norm", "eps_end",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-4, gt=0, le=10)
    gamma: float = ranged(0.99, ge=0, le=1)
    buffer_size: int = ranged(100_000, ge=1)
    batch_size: int = ranged(64, ge=1)
    learning_starts: int = ranged(1_000, ge=0)
    """Env steps stored before the first gradient step."""
    gradient_steps: int = ranged(1, ge=1, le=10_000)
    """Gradient steps per collected batch."""
    target_update_every: int = ranged(1_000, ge=1)
    """Gradient steps between target-network updates."""
    tau: float = ranged(1.0, gt=0, le=1)
    """Target update rate: 1.0 copies the online network, < 1 is a Polyak average."""
    double: bool = True
    eps_start: float = ranged(1.0, ge=0, le=1)
    eps_end: float = ranged(0.05, ge=0, le=1)
    eps_fraction: float = ranged(0.1, gt=0, le=1)
    """Fraction of the total env steps over which epsilon decays linearly."""
    max_grad_norm: float = ranged(10.0, gt=0)
    loss: Literal["huber", "mse"] = "huber"
    """Per-sample TD loss of the scalar (non-distributional) head."""
    n_step: int = ranged(1, ge=1, le=1_000)
    """Rewards summed per stored transition (per env, across collects); the window stops at an episode end."""
    prioritized: bool = False
    """Prioritized replay (sum-tree, stratified sampling, importance weights)."""
    priority_alpha: float = ranged(0.6, ge=0, le=1)
    """Sampling probability is priority ** alpha (0: uniform)."""
    priority_beta_start: float = ranged(0.4, ge=0, le=1)
    """Importance-weight exponent at the start; annealed linearly to 1 over the run's total steps."""
    priority_eps: float = ranged(1e-6, gt=0)
    """Added to each |TD error| (or distributional loss) so no transition's priority is 0."""
    dueling: bool = False
    """Dueling head: Q = V + A - mean(A) (per atom for the distributional heads)."""
    distributional: Literal["none", "c51", "qr"] = "none"
    """none: one Q per action; c51: a categorical distribution over ``atoms`` fixed returns in [v_min, v_max];
    qr: ``atoms`` quantiles of the return (QR-DQN)."""
    atoms: int = ranged(51, ge=2, le=10_000)
    """Atoms (c51) or quantiles (qr) per action."""
    v_min: float = -10.0
    """Lowest return of the C51 support."""
    v_max: float = 10.0
    """Highest return of the C51 support (must exceed v_min)."""
    kappa: float = ranged(1.0, gt=0)
    """Huber threshold of the QR-DQN quantile loss."""
    noisy: bool = False
    """NoisyNet layers (factorised Gaussian, resampled every gradient step) after the encoder: learned exploration
    (set eps_start = eps_end = 0 to explore by the noise alone); evaluation acts on the mean weights."""
    noisy_sigma: float = ranged(0.5, gt=0)
    """Initial noise scale sigma_0 of the NoisyNet layers (each weight's sigma starts at sigma_0 / sqrt(fan-in))."""

    def __post_init__(self) -> None:
        validate(self)
        if not self.v_min < self.v_max:
            from pickaxe.errors import ConfigError

            raise ConfigError(f"algo.v_max ({self.v_max}) must exceed algo.v_min ({self.v_min}): widen the support")


@dataclass
class LMConfig:
    """What every LLM learner (SFT, GRPO) is told: optimizer, micro-batching and how the forward pass is computed
    (the compute options change speed and memory, not the update beyond float rounding)."""

    mutable: ClassVar[tuple[str, ...]] = ("lr", "max_grad_norm")
    """Fields read afresh at every optimizer step, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-3, gt=0, le=10)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Decay over the run's total steps after the warmup."""
    warmup_updates: int = ranged(0, ge=0)
    weight_decay: float = ranged(0.0, ge=0)
    max_grad_norm: float = ranged(1.0, gt=0)
    micro_batch_size: int = ranged(64, ge=1)
    """Sequences per forward/backward; gradients accumulate over the optimizer step (does not change the update)."""
    micro_batch_layout: Literal["padded", "length-sorted", "packed"] = "padded"
    """padded: one sequence per row, in batch order; length-sorted: sequences of similar length share a
    micro-batch (less padding); packed: several sequences per row with block-diagonal attention (least padding)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of keeping them (less memory, ~1/3 more
    compute)."""
    autocast: Literal["off", "bf16"] = "off"
    """bf16: run the policy's and the reference's matrix multiplies in bfloat16 (CPU and CUDA), log-softmax and
    losses in float32; weights and optimizer state stay float32."""
    logprob_chunk_tokens: int = ranged(0, ge=0)
    """Scored tokens per chunk of the output layer (0: as many as fit 64 MiB of float32 logits), so memory does
    not grow with the vocabulary."""
    aggregation: Aggregation = "token-mean"
    """token-mean | seq-mean-token-mean (original GRPO) | seq-mean-token-sum-norm (Dr. GRPO)."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class SFTConfig(LMConfig):
    """Supervised fine-tuning of a causal LM on demonstrations (the loss on the completion tokens only)."""


@dataclass
class GRPOConfig(LMConfig):
    """Critic-free policy gradient on groups of completions per prompt (GRPO; RLOO, REINFORCE++ and the Dr. GRPO,
    DAPO and GSPO variants by flags); the defaults are DeepSeekMath's GRPO. Variants (see ``GRPOConfig.variant``):
    Dr. GRPO ``scale_rewards=False, aggregation=seq-mean-token-sum-norm``; DAPO ``clip_high=0.28,
    dynamic_sampling=True``; GSPO ``ratio_level=sequence``."""

    mutable: ClassVar[tuple[str, ...]] = ("lr", "clip_low", "clip_high", "max_grad_norm")
    """Fields read afresh at every optimizer step, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-5, gt=0, le=10)
    epochs: int = ranged(1, ge=1, le=10_000)
    """Passes over each batch."""
    mini_batches: int = ranged(1, ge=1)
    """Optimizer steps per pass (1: fully on-policy)."""
    clip_low: float = ranged(0.2, gt=0, lt=1)
    """Ratio clipped below at 1 - clip_low."""
    clip_high: float = ranged(0.2, gt=0)
    """Ratio clipped above at 1 + clip_high (DAPO's clip-higher: 0.28)."""
    scale_rewards: bool = True
    """Divide group-centred rewards by the group std (False: Dr. GRPO)."""
    advantage: Literal["group", "rloo", "reinforce++", "reinforce++-baseline"] = "group"
    """group: GRPO's group-normalised reward; rloo: leave-one-out baseline (mean of the other completions of the
    prompt); reinforce++: per-token returns of the reward (with k1 KL per token when kl_in=reward), whitened over the
    batch; reinforce++-baseline: the same after subtracting the group's mean reward."""
    loss_norm: int = ranged(0, ge=0)
    """Constant divisor of seq-mean-token-sum-norm (0: the generation budget, max_new_tokens)."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (no signal) before the update (DAPO)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """token: PPO ratio per token; sequence: GSPO's length-normalised sequence ratio."""
    kl_coef: float = ranged(0.0, ge=0)
    """Weight of KL(policy || reference) (0: no reference model is kept)."""
    kl_estimator: KLEstimator | None = None
    """k1, k2 or k3; None: by where the KL goes, k1 with kl_in=reward (InstructGPT's per-token penalty, what
    REINFORCE++ and RLOO shape the reward with) and k3 with kl_in=loss (low variance, never negative)."""
    kl_in: Literal["loss", "reward"] = "loss"
    """loss: a loss term; reward: subtracted from each sequence's reward (per token with reinforce++) before
    advantages."""
    tis_cap: float | None = ranged(None, gt=0)
    """Truncated importance sampling: recompute old log-probs with the learner and weight each token's loss by
    min(pi_learner / pi_sampler, tis_cap) (for engines whose numerics differ from the learner's, e.g. vLLM)."""
    ratio_tolerance: float = ranged(1e-3, gt=0)
    """Warn when the first on-policy micro-batch has max |learner - sampler log-prob| above this."""
    share_prompts: bool = True
    """The completions of a prompt share one pass over it in the learner's and the reference's forward passes
    (padded layout, SDPA attention; same numbers up to float rounding, fewer FLOPs)."""

    @property
    def kl_estimator_in_effect(self) -> KLEstimator:
        """The KL estimator the update uses: ``kl_estimator``, or when it is None k1 with ``kl_in="reward"`` and
        k3 with ``kl_in="loss"``."""
        if self.kl_estimator is not None:
            return self.kl_estimator
        return "k1" if self.kl_in == "reward" else "k3"

    @classmethod
    def variant(cls, name: Literal["grpo", "dr-grpo", "dapo", "gspo"], **overrides) -> GRPOConfig:
        """A config preset for a named variant, with ``overrides`` applied."""
        presets = {
            "grpo": {},
            "dr-grpo": {"scale_rewards": False, "aggregation": "seq-mean-token-sum-norm"},
            "dapo": {"clip_high": 0.28, "dynamic_sampling": True, "aggregation": "token-mean"},
            "gspo": {
                "ratio_level": "sequence",
                "clip_low": 3e-4,
                "clip_high": 4e-4,
                "aggregation": "seq-mean-token-mean",
            },
        }
        if name not in presets:
            raise ValueError(f"unknown GRPO variant {name!r}; choose one of {sorted(presets)}")
        return cls(**{**presets[name], **overrides})


@dataclass
class RewardModelConfig(LMConfig):
    """A Bradley–Terry reward model trained on preference pairs. ``micro_batch_size`` counts sequences and is
    rounded down to whole pairs (at least one pair: both responses of a pair share a forward)."""

    mutable: ClassVar[tuple[str, ...]] = ("lr", "max_grad_norm", "margin")
    """Fields read afresh at every optimizer step, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-5, gt=0, le=10)
    margin: float = ranged(0.0, ge=0)
    """The chosen score must lead by this much: loss -log sigmoid(r_chosen - r_rejected - margin). A batch's
    per-pair ``margin`` key (preference strength, Llama 2) is added to it."""
    share_prompts: bool = True
    """A pair's chosen and rejected responses (and pairs of one prompt in a micro-batch) share one pass over their
    prompt, both scores from it (padded layout, SDPA attention; same numbers up to float rounding, fewer FLOPs)."""


DPOLoss = Literal["sigmoid", "ipo"]
"""DPO's loss on the log-ratio gap: sigmoid (DPO, cDPO with label smoothing) or ipo."""


@dataclass
class DPOConfig(LMConfig):
    """Direct Preference Optimization on preference pairs against a frozen reference. ``micro_batch_size`` counts
    sequences and is rounded down to whole pairs (at least one pair)."""

    mutable: ClassVar[tuple[str, ...]] = ("lr", "max_grad_norm", "beta")
    """Fields read afresh at every optimizer step, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(5e-7, gt=0, le=10)
    beta: float = ranged(0.1, gt=0, le=100)
    """Strength of the KL anchor to the reference (implicit reward = beta * log-ratio); usual range 0.01-0.5."""
    loss: DPOLoss = "sigmoid"
    """sigmoid: -log sigmoid(beta h) (DPO); ipo: (h - 1/(2 beta))^2 on per-token mean log-probs (IPO)."""
    label_smoothing: float = ranged(0.0, ge=0, lt=0.5)
    """Probability that a label is flipped (conservative DPO, sigmoid loss only); 0 is plain DPO."""
    share_prompts: bool = True
    """A pair's chosen and rejected responses (and pairs of one prompt in a micro-batch) share one pass over their
    prompt in the policy's and the reference's forward passes (padded layout, SDPA attention; same numbers up to
    float rounding, fewer FLOPs)."""

    def __post_init__(self) -> None:
        validate(self)
        if self.loss == "ipo" and self.label_smoothing:
            raise ValueError("label_smoothing applies to the sigmoid loss only; set it to 0 with loss='ipo'")


@dataclass
class LLMPPOConfig(LMConfig):
    """PPO with a critic on a causal LM (InstructGPT; "The N+ implementation details of RLHF with PPO"). The
    defaults are InstructGPT's (k1 KL penalty 0.02 per token in the reward, clip 0.2, gamma 1, lambda 0.95) and
    those of OpenAI's lm-human-preferences code it builds on (value clip 0.2, vf_coef 0.1, 4 epochs). ``lr``,
    ``weight_decay`` and the schedule apply to the policy; the critic has its own ``critic_lr`` and
    ``critic_max_grad_norm`` (same warmup and schedule)."""

    mutable: ClassVar[tuple[str, ...]] = (
        "lr", "critic_lr", "max_grad_norm", "critic_max_grad_norm", "clip", "value_clip", "vf_coef", "kl_coef",
        "ptx_coef",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-5, gt=0, le=10)
    critic_lr: float | None = ranged(None, gt=0, le=10)
    """Learning rate of the critic (None: the same as ``lr``)."""
    critic_max_grad_norm: float = ranged(1.0, gt=0)
    """Gradient-norm clip of the critic (the policy's is ``max_grad_norm``)."""
    epochs: int = ranged(4, ge=1, le=10_000)
    """Passes over each batch (the first step of an update has ratio 1; later ones are off-policy and clipped)."""
    mini_batches: int = ranged(1, ge=1)
    """Optimizer steps per pass."""
    clip: float = ranged(0.2, gt=0, lt=1)
    """Policy ratio clipped to [1 - clip, 1 + clip]."""
    value_clip: float | None = ranged(0.2, gt=0)
    """Clip each new value to old value +- this in the value loss (None: no value clipping)."""
    vf_coef: float = ranged(0.1, ge=0)
    """Weight of the critic's loss 0.5 (V - return)^2 (it scales the critic's gradients only: separate networks)."""
    gamma: float = ranged(1.0, ge=0, le=1)
    """Discount over response tokens."""
    lam: float = ranged(0.95, ge=0, le=1)
    """GAE lambda."""
    whiten_advantages: bool = True
    """Normalise the advantages of each batch to mean 0, variance 1 over its response tokens."""
    kl_coef: float = ranged(0.02, ge=0)
    """Weight of KL(policy || reference) (0: no ``ref_logprob`` needed)."""
    kl_estimator: KLEstimator = "k1"
    """k1 (log pi - log pi_ref, InstructGPT's per-token penalty in the reward), k2 or k3 (usual with kl_in=loss)."""
    kl_in: Literal["reward", "loss"] = "reward"
    """reward: subtract kl_coef x the per-token KL from each token's reward before GAE; loss: a loss term."""
    ptx_coef: float = ranged(0.0, ge=0)
    """PPO-ptx: weight of the language-modelling loss on a batch of demonstrations mixed into every policy step
    (needs the algorithm's ``ptx`` source; 0: off)."""
    ratio_tolerance: float = ranged(1e-3, gt=0)
    """Warn when learner and sampler log-probs of the batch differ by more than this before the update (stale
    engine weights or other numerics: the samples then come from another policy than the learner's)."""
