"""The memory planner behind ``pickaxe plan``: what an LLM run holds per device, from its config alone.

Torch-free and instant: it reads the config (and a ``--model.path`` or ``--data.reward-model`` folder's
``config.json``), never a model. Per learner it counts, in bytes:

- exact terms, equal to the tensors a built model and its AdamW hold after a step (tests/test_plan.py checks them
  against real tensors): the weights in the model's dtype, the gradients and AdamW's two moments of every trained
  parameter (in the parameter's dtype, as ``torch.optim.AdamW`` keeps them: pickaxe keeps no float32 master copy
  outside FSDP) plus its float32 step count per tensor; LoRA adapters in float32 (peft's default), only they train;
  the frozen models (the KL reference, a reward model), PPO's critic (trained like the policy);
- estimates: the activations one micro-batch keeps for its backward pass (per decoder layer and token 11 hidden-sized
  and 4 MLP-sized values, or with gradient checkpointing one hidden-sized value per layer and one layer recomputed;
  the output layer's float32 logits of one chunk of scored tokens, three copies), calibrated on the CPU against
  measured peaks (tests/test_plan.py holds them to +-35%); with ``--dist.shard fsdp`` the units FSDP gathers
  while they compute (the root unit, embeddings and output layer, for the whole forward and backward; two decoder
  layers at a time); the KV cache of colocated generation (``engine.max_batch`` rows of prompt + new tokens,
  not at the same time as gradients and activations).

``--dist.shard fsdp`` divides the trained networks' weights, gradients and optimizer state by the learners, and
rank 0 keeps an unsharded copy of the policy (what generation, evaluation and export read; the reward model when
training one); the frozen reference (DPO's, and the KL reference of GRPO and PPO unless it is the LoRA policy) and
the reward model that scores the rollouts (``--data.reward-model``) are sharded too: 1/N of each on every learner,
rank 0 included, plus the units gathered while it scores (``--dist.no-shard-reference``,
``--dist.no-shard-reward-model``: whole on rank 0, DPO's reference on every learner). ``--dist.offload params``
moves the sharded weights (the frozen models' too), gradients and optimizer state to host memory; ``optimizer`` only
the AdamW state (``HostAdamW``), with host copies of the weight and gradient shards the step is staged through;
``--collector.offload-reward-model`` keeps the reward model's shards on the host.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pickaxe.algos.configs import DPOConfig, GRPOConfig, LLMPPOConfig, RewardModelConfig
from pickaxe.errors import ConfigError
from pickaxe.models.folders import check_tiny_shape
from pickaxe.models.shapes import Shape, shape_from_config
from pickaxe.train.llm_config import BestOfNConfig, LLMTrainConfig

GiB = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LOGITS_BUDGET_BYTES = 64 << 20
"""``pickaxe.models.lm.LOGITS_BUDGET_BYTES``: one chunk of float32 logits when ``--algo.logprob-chunk-tokens`` is 0."""
LORA_BYTES = 4
"""peft keeps LoRA adapters in float32 whatever the base model's dtype."""
ADAM_STEP_BYTES = 4
"""AdamW's ``step`` count: one float32 scalar per parameter tensor."""
LAYER_HIDDEN_VALUES = 11
"""Hidden-sized values a decoder layer keeps per token for its backward pass (norms, q, repeated k and v, the
attention's output twice, residual), measured; :data:`LAYER_MLP_VALUES` MLP-sized ones (gate, up, SiLU, product)."""
LAYER_MLP_VALUES = 4
LOGITS_COPIES = 3
"""Float32 ``[tokens, vocab]`` tensors alive at once around the output layer (logits, log-softmax, their gradient)."""
TOLERANCE = 0.35
"""How far the activation estimate may be from a measured peak (tests/test_plan.py)."""

Where = Literal["device", "host"]
Phase = Literal["resident", "train", "generate", "score"]


@dataclass
class Term:
    """One line of a rank's memory: ``bytes`` on the device or the host, held all the time (``resident``), while
    training (``train``: gradients, activations, gathered units), while generating (``generate``) or while an
    offloaded reference scores on the device (``score``)."""

    name: str
    bytes: int
    where: Where = "device"
    phase: Phase = "resident"
    note: str = ""


@dataclass
class RankPlan:
    """The memory of one rank (or of several alike: ``ranks``)."""

    ranks: str
    terms: list[Term] = field(default_factory=list)

    def add(self, name: str, n: float, where: Where = "device", phase: Phase = "resident", note: str = "") -> None:
        """Add a term (skipped when it is zero bytes)."""
        if n > 0:
            self.terms.append(Term(name, int(n), where, phase, note))

    def peak(self, where: Where) -> int:
        """Peak bytes on ``where``: what is resident plus the largest of the training, generation and scoring
        phases."""
        by_phase = {p: sum(t.bytes for t in self.terms if t.where == where and t.phase == p) for p in
                    ("resident", "train", "generate", "score")}  # fmt: skip
        return by_phase["resident"] + max(by_phase["train"], by_phase["generate"], by_phase["score"])


@dataclass
class MemoryPlan:
    """What a run needs per rank, with the figures it was computed from."""

    model: str
    algo: str
    parameters: int
    trainable: int
    dtype: str
    learners: int
    shard: str
    offload: str
    sequence: int
    prompt_tokens: int
    micro_batch: int
    activations: dict[str, int]
    ranks: list[RankPlan]
    device_gib: float | None = None
    notes: list[str] = field(default_factory=list)

    def fits(self) -> bool | None:
        """Whether every rank's device peak is within ``device_gib`` (None without it)."""
        if self.device_gib is None:
            return None
        return all(r.peak("device") <= self.device_gib * GiB for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        """The plan as one JSON-ready object (bytes as integers)."""
        return {
            "model": self.model, "algo": self.algo, "parameters": self.parameters, "trainable": self.trainable,
            "dtype": self.dtype, "learners": self.learners, "shard": self.shard, "offload": self.offload,
            "sequence_tokens": self.sequence, "prompt_tokens": self.prompt_tokens, "micro_batch": self.micro_batch,
            "activations": self.activations,
            "ranks": [{"ranks": r.ranks, "device_peak": r.peak("device"), "host_peak": r.peak("host"),
                       "terms": [vars(t) for t in r.terms]} for r in self.ranks],
            "device_gib": self.device_gib, "fits": self.fits(), "notes": self.notes,
        }  # fmt: skip

    def render(self) -> str:
        """The plan as a table: one column per rank kind, device terms then host terms, the peaks, the verdict."""
        heads = [r.ranks for r in self.ranks]
        big = max(r.peak(w) for r in self.ranks for w in ("device", "host")) >= GiB
        unit, scale = ("GiB", GiB) if big else ("MiB", 1 << 20)
        batch = (
            f"micro-batch {self.micro_batch} sequences of {self.sequence} tokens"
            if self.micro_batch
            else f"no training; sequences of {self.sequence} tokens"
        )
        lines = [
            f"{self.model}: {self.parameters / 1e9:.3g} B parameters, {self.trainable / 1e9:.3g} B trained, "
            f"{self.dtype}; {self.algo}, {self.learners} learner{'s' if self.learners > 1 else ''}, "
            f"shard {self.shard}, offload {self.offload}",
            f"{batch} ({self.prompt_tokens} prompt tokens, --prompt-tokens, + the new tokens)",
            "",
            f"{unit:44}" + "".join(f"{h:>14}" for h in heads),
        ]
        for where in ("device", "host"):
            names: list[tuple[str, str]] = []
            for r in self.ranks:
                for t in r.terms:
                    if t.where == where and (t.name, t.note) not in names:
                        names.append((t.name, t.note))
            if not names:
                continue
            lines.append(where)
            for name, note in names:
                cells = []
                for r in self.ranks:
                    n = sum(t.bytes for t in r.terms if t.where == where and (t.name, t.note) == (name, note))
                    cells.append(f"{n / scale:14.2f}" if n else f"{'-':>14}")
                label = f"  {name}" + (f" ({note})" if note else "")
                lines.append(f"{label[:44]:44}" + "".join(cells))
            lines.append(f"{'  peak':44}" + "".join(f"{r.peak(where) / scale:14.2f}" for r in self.ranks))
        a = self.activations
        lines.append(
            f"activations per micro-batch: {a['no_checkpointing'] / scale:.2f} {unit} without gradient checkpointing, "
            f"{a['checkpointing'] / scale:.2f} {unit} with it (estimates, +-{TOLERANCE:.0%})"
        )
        if self.device_gib is not None:
            verdicts = [
                f"{r.ranks}: {'fits' if r.peak('device') <= self.device_gib * GiB else 'does not fit'} "
                f"({r.peak('device') / GiB:.1f} GiB)"
                for r in self.ranks
            ]
            lines.append(f"on {self.device_gib:g} GiB devices: {', '.join(verdicts)}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- shapes


def _folder_config(path: str, flag: str) -> dict[str, Any]:
    file = Path(path) / "config.json"
    try:
        record = json.loads(file.read_bytes())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{flag} {path!r}: cannot read {file} ({' '.join(str(e).split())})") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{file} is not a JSON object; {flag} needs a saved model folder")
    return record


def _record_dtype(record: dict[str, Any]) -> str:
    value = record.get("dtype") or record.get("torch_dtype") or "float32"
    return value if value in DTYPE_BYTES else "float32"


def policy_shape(cfg: LLMTrainConfig) -> tuple[Shape, str]:
    """The policy's shape and its weights' dtype: ``--model.path``'s ``config.json``, else the tiny model's."""
    m = cfg.model
    if m.path is not None:
        record = _folder_config(m.path, "--model.path")
        shape = shape_from_config(record, f"--model.path {m.path}")
        return shape, _record_dtype(record) if m.dtype == "auto" else m.dtype
    return m.tiny_shape(), "float32" if m.dtype == "auto" else m.dtype


def reward_model_shape(cfg: LLMTrainConfig, policy: Shape, dtype: str) -> tuple[Shape, str, bool]:
    """The shape and dtype of ``--data.reward-model``'s backbone; when its folder cannot be read yet (an earlier
    stage writes it), the policy's, with False."""
    path = cfg.data.reward_model
    try:
        record = _folder_config(str(path), "--data.reward-model")
        backbone = record.get("backbone")
        if not isinstance(backbone, dict):
            raise ConfigError("no backbone")
        return shape_from_config(backbone), _record_dtype(backbone), True
    except ConfigError:
        return policy, dtype, False


# ---------------------------------------------------------------------------------------------- activations


def layer_activations(shape: Shape, tokens: int, act_bytes: float) -> float:
    """Bytes one decoder layer keeps for its backward pass over ``tokens`` tokens."""
    return tokens * act_bytes * (LAYER_HIDDEN_VALUES * shape.hidden + LAYER_MLP_VALUES * shape.intermediate)


def logits_bytes(shape: Shape, scored: int, chunk_tokens: int) -> float:
    """Bytes around the output layer: ``LOGITS_COPIES`` float32 ``[rows, vocab]`` tensors, rows the scored tokens of
    one micro-batch or one chunk of them (``pickaxe.models.lm.head_logprobs``)."""
    chunk = chunk_tokens or max(1, LOGITS_BUDGET_BYTES // (4 * shape.vocab))
    return LOGITS_COPIES * min(scored, chunk) * shape.vocab * 4


def activations(shape: Shape, tokens: int, scored: int, act_bytes: float, chunk_tokens: int,
                checkpointing: bool, head: bool = True) -> float:  # fmt: skip
    """Peak bytes of one micro-batch's forward and backward of ``tokens`` tokens (``scored`` of them through the
    output layer; ``head`` False: a scalar head, a reward model's or a critic's). Without checkpointing every layer
    keeps its activations; with it every layer keeps its input and one layer is recomputed at a time."""
    layer = layer_activations(shape, tokens, act_bytes)
    edges = 2 * tokens * shape.hidden * act_bytes  # the embedding's output and the final norm's
    logits = logits_bytes(shape, scored, chunk_tokens) if head else 0.0
    if not checkpointing:
        return shape.layers * layer + edges + logits
    kept = shape.layers * tokens * shape.hidden * act_bytes
    return kept + edges + max(layer + 2 * tokens * shape.intermediate * act_bytes, logits)


# ---------------------------------------------------------------------------------------------- the plan


@dataclass
class Network:
    """A model the run holds: its parameters, trained parameters and their tensors, bytes per value."""

    name: str
    shape: Shape
    parameters: int
    dtype_bytes: int
    trained: int = 0
    trained_tensors: int = 0
    trained_bytes: int = 4
    extra_bytes: int = 0
    """Weights beyond ``parameters * dtype_bytes`` (LoRA adapters, in float32)."""

    @property
    def weight_bytes(self) -> int:
        """The weights' bytes."""
        return self.parameters * self.dtype_bytes + self.extra_bytes

    @property
    def grad_bytes(self) -> int:
        """The gradients' bytes (trained parameters only)."""
        return self.trained * self.trained_bytes

    @property
    def optimizer_bytes(self) -> int:
        """AdamW's state: two moments per trained parameter in its dtype and one float32 step per tensor."""
        return 2 * self.trained * self.trained_bytes + ADAM_STEP_BYTES * self.trained_tensors


def algo_name(cfg: LLMTrainConfig) -> str:
    """The run's algorithm by its config name (sft, grpo, ppo, rm, dpo, bon)."""
    return next(name for name, t in LLMTrainConfig.ALGOS.items() if type(cfg.algo) is t)


def networks(cfg: LLMTrainConfig, shape: Shape, dtype: str) -> tuple[list[Network], list[Network], list[str]]:
    """``(trained, frozen, notes)``: the networks a run trains and those it only runs, on rank 0."""
    a, m, notes = cfg.algo, cfg.model, []
    pb = DTYPE_BYTES[dtype]
    lora = m.lora.enabled and not isinstance(a, RewardModelConfig)
    policy = Network("policy", shape, shape.parameters(), pb)
    if lora:
        n, tensors = shape.lora_parameters(m.lora.r, m.lora.target_modules)
        policy.extra_bytes = n * LORA_BYTES
        policy.trained, policy.trained_tensors, policy.trained_bytes = n, tensors, LORA_BYTES
    else:
        policy.trained, policy.trained_tensors, policy.trained_bytes = shape.parameters(), shape.tensors(), pb
    trained: list[Network] = []
    frozen: list[Network] = []
    if isinstance(a, RewardModelConfig):
        rm = Network("reward model", shape, shape.backbone_parameters() + shape.hidden, pb)
        rm.trained, rm.trained_tensors, rm.trained_bytes = rm.parameters, shape.backbone_tensors() + 1, pb
        trained.append(rm)
    elif isinstance(a, BestOfNConfig):
        policy.trained = policy.trained_tensors = 0
        frozen.append(policy)
    else:
        trained.append(policy)
    kl = getattr(a, "kl_coef", 0.0) > 0 or isinstance(a, DPOConfig)
    if kl and not lora:
        frozen.append(Network("reference model", shape, shape.parameters(), pb))
    elif kl:
        notes.append("the KL reference is the LoRA policy with its adapters off: no second copy")
    if cfg.data.reward_model and not isinstance(a, RewardModelConfig):
        rshape, rdtype, read = reward_model_shape(cfg, shape, dtype)
        if not read:
            notes.append(f"--data.reward-model {cfg.data.reward_model} is not readable yet: counted at the policy's "
                         "shape")  # fmt: skip
        frozen.append(Network("reward model", rshape, rshape.backbone_parameters() + rshape.hidden,
                              DTYPE_BYTES[rdtype]))  # fmt: skip
    if isinstance(a, LLMPPOConfig):
        cshape, cbytes = (frozen[-1].shape, frozen[-1].dtype_bytes) if cfg.data.reward_model else (shape, pb)
        critic = Network("critic", cshape, cshape.backbone_parameters() + cshape.hidden + 1, cbytes)
        critic.trained, critic.trained_bytes = critic.parameters, cbytes
        critic.trained_tensors = cshape.backbone_tensors() + 2
        trained.append(critic)
    return trained, frozen, notes


def plan_memory(cfg: LLMTrainConfig, prompt_tokens: int = 256, device_gib: float | None = None) -> MemoryPlan:
    """The memory plan of ``cfg`` (an :class:`LLMTrainConfig`) with prompts of ``prompt_tokens`` tokens."""
    if not isinstance(cfg, LLMTrainConfig):
        raise ConfigError("pickaxe plan counts the memory of LLM recipes; classic recipes fit anywhere")
    a, d = cfg.algo, cfg.dist
    d.check(llm=True)
    if cfg.model.path is None:
        check_tiny_shape(cfg.model.hidden, cfg.model.heads, cfg.model.kv_heads)
    shape, dtype = policy_shape(cfg)
    trained, frozen, notes = networks(cfg, shape, dtype)
    name = algo_name(cfg)
    n = d.learners
    sharded = d.shard == "fsdp"
    bf16 = getattr(a, "autocast", "off") == "bf16"  # best-of-n trains nothing and has no compute options
    pb = DTYPE_BYTES[dtype]
    act_bytes = 2.0 if pb == 2 else (2.5 if bf16 else 4.0)  # autocast: matmul outputs bf16, norms and residuals fp32
    new_tokens = cfg.agent.max_tokens if cfg.agent.enabled else cfg.engine.max_new_tokens
    seq = prompt_tokens + new_tokens
    if cfg.model.path is None and cfg.model.shape is None and seq > cfg.model.max_positions:
        prompt_tokens, seq = max(cfg.model.max_positions - new_tokens, 1), cfg.model.max_positions
        notes.append(f"the tiny model takes {cfg.model.max_positions} tokens (--model.max-positions): sequences "
                     "counted at that length")  # fmt: skip
    mb = getattr(a, "micro_batch_size", 0)
    tokens, scored = mb * seq, mb * new_tokens
    acts: dict[str, int] = {}
    for key, ckpt in (("no_checkpointing", False), ("checkpointing", True)):
        acts[key] = int(sum(activations(t.shape, tokens, scored, act_bytes, getattr(a, "logprob_chunk_tokens", 0), ckpt,
                                        head=t.name == "policy") for t in trained))  # fmt: skip
    act = acts["checkpointing" if getattr(a, "gradient_checkpointing", False) else "no_checkpointing"]
    rm = isinstance(a, RewardModelConfig)
    dpo = isinstance(a, DPOConfig)  # each learner scores its share of the pairs with the reference
    # sharded, every learner holds 1/n of the frozen reference and of the reward model (rank 0 included); unsharded,
    # DPO's reference is whole everywhere, the reward model whole on rank 0 (best-of-n: no learners to shard over)
    split = [f for f in frozen if sharded and d.shard_reference and f.name == "reference model"]
    split += [f for f in frozen if sharded and d.shard_reward_model and f.name == "reward model"
              and not isinstance(a, BestOfNConfig)]  # fmt: skip
    everywhere = [f for f in frozen if dpo and f.name == "reference model" and not split]

    def rank(label: str, zero: bool) -> RankPlan:
        r = RankPlan(label)
        share = n if sharded else 1
        for t in trained:
            # params: FSDP2 keeps the shards on the host; optimizer: HostAdamW keeps only AdamW's state there
            weights_where: Where = "host" if sharded and d.offload == "params" else "device"
            state_where: Where = "host" if sharded and d.offload != "none" else "device"
            r.add(f"{t.name} weights" + (f" (1/{n})" if sharded else ""), t.weight_bytes / share, weights_where)
            r.add(f"{t.name} gradients" + (f" (1/{n})" if sharded else ""), t.grad_bytes / share, weights_where,
                  "train")  # fmt: skip
            r.add(f"{t.name} AdamW state" + (f" (1/{n})" if sharded else ""), t.optimizer_bytes / share, state_where)
            if sharded and d.offload == "optimizer" and cfg.device != "cpu":
                r.add(f"{t.name} step staging (1/{n})", 2 * t.grad_bytes / share, "host",
                      note="pinned")  # fmt: skip
            if sharded:
                cb = 2 if bf16 else t.dtype_bytes
                unit = max(t.shape.layer_parameters(), 1)
                root = t.parameters - t.shape.layers * t.shape.layer_parameters()
                grads = (root + unit) * t.trained_bytes if t.trained == t.parameters else 0  # LoRA: adapters only
                r.add(f"{t.name} gathered units", (root + 2 * unit) * cb + grads, phase="train", note="transient")
            elif bf16:
                r.add(f"{t.name} bf16 weight copies", t.parameters * 2, phase="train", note="autocast")
        r.add("activations", act, phase="train", note="one micro-batch")
        if cfg.trainer.async_checkpoint:  # the copy a background checkpoint writes from, while training goes on
            copy = sum((t.weight_bytes + t.optimizer_bytes) / share for t in trained)
            r.add("checkpoint copy", copy, "device" if cfg.device == "cpu" else "host",
                  note="--trainer.async-checkpoint")  # fmt: skip
        for f in everywhere if not zero else []:
            r.add(f.name, f.weight_bytes, note="frozen")
        for f in split:
            scorer = f.name == "reward model"  # sharded in its own dtype; --collector.offload-reward-model: on host
            host = d.offload == "params" or (scorer and cfg.collector.offload_reward_model)
            r.add(f"{f.name} (1/{n})", f.weight_bytes / n, "host" if host else "device", note="frozen")
            unit = max(f.shape.layer_parameters(), 1)
            root = f.parameters - f.shape.layers * f.shape.layer_parameters()
            r.add(f"{f.name} gathered units", (root + 2 * unit) * (2 if bf16 and not scorer else f.dtype_bytes),
                  phase="score", note="transient")  # fmt: skip
        if zero:
            if sharded:  # the policy (the reward model, when training one) whole, beside the shards
                whole = trained[0]
                r.add(f"{whole.name}, unsharded", whole.weight_bytes, note="eval" if rm else "generation, eval")
            for f in (f for f in frozen if f not in split):
                offloaded = (f.name == "reference model" and cfg.collector.offload_reference) or (
                    f.name == "reward model" and cfg.collector.offload_reward_model
                )
                r.add(f.name, f.weight_bytes, "host" if offloaded else "device", note="frozen")
                if offloaded:
                    r.add(f.name, f.weight_bytes, phase="score", note="while scoring")
            rollouts = isinstance(a, GRPOConfig | LLMPPOConfig) and d.placement == "colocated"
            batch = cfg.collector.prompts * cfg.collector.group_size if rollouts else 0
            evaluation = 0 if isinstance(a, RewardModelConfig) else cfg.eval.prompts * max(cfg.eval.samples, 1)
            rows = min(cfg.engine.max_batch, max(batch, evaluation))
            if rows and cfg.engine.name == "hf":
                kv = 2 * shape.layers * shape.kv_heads * shape.head_size * seq * rows * pb
                r.add("KV cache", kv, phase="generate", note=f"{rows} rows")
        return r

    ranks = [rank("rank 0" if n > 1 else "learner", True)]
    if n > 1:
        ranks.append(rank(f"ranks 1-{n - 1}" if n > 2 else "rank 1", False))
    if d.placement == "separate":
        notes.append("engine workers (--dist.placement separate) hold their own copy of the policy: not counted here")
    if cfg.engine.name == "vllm" and d.placement == "colocated":
        notes.append(f"vLLM takes --engine.gpu-memory-utilization {cfg.engine.gpu_memory_utilization} of the device "
                     "for its weights and KV cache: not counted here")  # fmt: skip
    if sharded and d.offload == "params":
        notes.append("--dist.offload params: the shards, their gradients and the optimizer step live on the host")
    if sharded and d.offload == "optimizer":
        notes.append("--dist.offload optimizer: AdamW's state and step live on the host, the shards and their "
                     "gradients on the device (copied to the host and back once per optimizer step)")  # fmt: skip
    if cfg.device == "cpu":
        notes.append("--device cpu: device memory is host memory")
    return MemoryPlan(
        model=shape.name, algo=name, parameters=shape.parameters(),
        trainable=sum(t.trained for t in trained), dtype=dtype, learners=n, shard=d.shard, offload=d.offload,
        sequence=seq, prompt_tokens=prompt_tokens, micro_batch=mb, activations=acts, ranks=ranks,
        device_gib=device_gib, notes=notes,
    )  # fmt: skip
