"""The typed config of an LLM run (``LLMTrainConfig`` and its sections); torch-free, like every config."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pickaxe.algos.configs import DPOConfig, GRPOConfig, LLMPPOConfig, RewardModelConfig, SFTConfig
from pickaxe.config_keys import ranged, validate
from pickaxe.errors import ConfigError, PickaxeError
from pickaxe.eval.alarms import AlarmConfig
from pickaxe.eval.selection import SelectConfig
from pickaxe.models.shapes import Shape, get_shape
from pickaxe.models.tokenizer import CHAR_VOCAB
from pickaxe.supplied import check_records, record_names
from pickaxe.train.config import DistConfig, RunConfig, TrainerConfig, device_field


@dataclass
class LoRAConfig:
    """LoRA adapters on the policy: ``r`` 0 means none (full fine-tuning). Torch-free, like every config."""

    r: int = ranged(0, ge=0)
    """Rank of each adapter; 0: no LoRA, every weight trains."""
    alpha: float = ranged(16.0, gt=0)
    """Scale: an adapter adds ``alpha / r * B @ A`` to its layer's weight."""
    dropout: float = ranged(0.0, ge=0, lt=1)
    """Dropout on the adapters' input while training. Above 0 the learner's log-probs are no longer the sampler's
    (the on-policy ratio is not 1), so keep 0 for GRPO."""
    target_modules: tuple[str, ...] = field(default_factory=lambda: ("all-linear",))
    """Module names to adapt (e.g. q_proj v_proj), or all-linear: every linear layer but the output layer."""

    def __post_init__(self) -> None:
        validate(self)
        if not self.target_modules:
            raise ConfigError(
                "lora.target_modules is empty; name the layers to adapt (e.g. q_proj v_proj) or all-linear"
            )

    @property
    def enabled(self) -> bool:
        """Whether adapters are applied (``r`` > 0)."""
        return self.r > 0


@dataclass
class LMConfig:
    """Which language model: a local transformers folder, or (no path) a tiny randomly initialised one with a
    character-level tokenizer."""

    path: str | None = None
    """Folder of a saved causal LM (config.json, weights, tokenizer); None: the tiny model below."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    shape: str | None = None
    """A real model's shape for the tiny random-weight model (qwen2-0.5b, qwen2.5-7b, llama-3-8b, ...: `pickaxe plan
    --help` lists them): it sets arch, hidden, layers, heads, kv_heads and intermediate, and the embedding's rows (the
    character tokenizer uses the first ids) and tying; None: the fields below and untied embeddings over the
    tokenizer's vocabulary."""
    arch: Literal["qwen2", "llama"] = "qwen2"
    hidden: int = ranged(128, ge=1)
    layers: int = ranged(4, ge=1)
    heads: int = ranged(4, ge=1)
    kv_heads: int = ranged(2, ge=1)
    intermediate: int = ranged(512, ge=1)
    max_positions: int = ranged(64, ge=2)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters (needs the ``lora`` extra); r 0: full fine-tuning."""

    SHAPE_FIELDS: ClassVar[tuple[str, ...]] = ("arch", "hidden", "layers", "heads", "kv_heads", "intermediate")
    """The fields a named ``shape`` sets."""

    def __post_init__(self) -> None:
        validate(self)
        if self.shape is not None:
            if self.path is not None:
                raise ConfigError(
                    f"--model.shape {self.shape} builds a random-weight model, --model.path loads one: drop one of them"
                )
            s = get_shape(self.shape)
            for name in self.SHAPE_FIELDS:
                setattr(self, name, getattr(s, name))

    def tiny_shape(self) -> Shape:
        """The tiny model's shape: the named ``shape``, or the fields with ``vocab`` rows and untied embeddings
        (``vocab``: the character tokenizer's size, which a named shape replaces by its own)."""
        if self.shape is not None:
            return get_shape(self.shape)
        return Shape(self.arch, self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate,
                     CHAR_VOCAB, tied=False, name="tiny")  # fmt: skip


@dataclass
class TaskConfig:
    """A built-in verifiable task, generated from the seed (used when ``data.path`` is not set)."""

    name: Literal["addition", "multiplication", "reverse", "sort", "countdown"] = "addition"
    digits: int = ranged(2, ge=1, le=18)
    """Operand digits (addition, multiplication); numbers to combine (countdown)."""
    min_len: int = ranged(3, ge=1)
    """Shortest digit string (reverse, sort)."""
    max_len: int = ranged(6, ge=1)
    """Longest digit string (reverse, sort)."""
    heldout_fraction: float = ranged(0.1, gt=0, lt=1)
    """Share of the problem space reserved for evaluation."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class DataConfig:
    """Prompts from a file instead of a task."""

    path: str | None = None
    """A .jsonl/.json/.parquet prompt file; set, it replaces the task."""
    eval_path: str | None = None
    """Held-out prompts (default: a seeded 10% of ``path``)."""
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    reward: str | None = None
    """The training reward as a spec: NAME or MODULE:ATTR terms with weights, joined by '+' (e.g.
    ``exact+0.5*mypkg.rewards:score``; weight 0 logs without training on it). Built-in names: exact, numeric and, with
    a task, ``verify`` (its own check). None: exact for a prompt file, verify for a task."""
    reward_model: str | None = None
    """Folder of a saved reward model (``RUN_DIR/export`` of a reward-model run): its score is the training reward
    (weight ``reward_model_weight``), logged as ``proxy``; the task's or file's own reward is then logged only."""
    reward_model_weight: float = ranged(1.0, gt=0)
    gold: str | None = None
    """Hidden gold score(s) as a reward spec (``sort-quality``, a built-in, or MODULE:ATTR), logged as ``gold``
    (training and evaluation) but never trained on: with a reward model as the proxy, gold falling while proxy rises
    is reward over-optimisation. Also labels generated preference pairs."""
    python_rewards: tuple[str, ...] = ()
    """Rewards passed as Python objects (``pickaxe.train(..., rewards={NAME: fn})``), which ``reward`` and ``gold``
    name by NAME: recorded as NAME=MODULE:QUALNAME, since config.json cannot hold a function. A resume in another
    process passes them again (``pickaxe.resume(RUN_DIR, rewards=...)``), or imports them by that path when the
    module is importable (not a script's ``__main__``)."""

    def __post_init__(self) -> None:
        validate(self)
        check_records(self.python_rewards, "data.python_rewards")

    def python_reward_names(self) -> list[str]:
        """The names ``reward`` and ``gold`` may use for the Python rewards (``python_rewards``)."""
        return record_names(self.python_rewards)


@dataclass
class PreferenceConfig:
    """Preference pairs of reward-model and DPO runs: a file, or (no ``path``) generated from the starting policy's
    own samples of the task, labelled by the ``data.gold`` scorer (a stand-in for human raters)."""

    path: str | None = None
    """A .jsonl/.json/.parquet file of {prompt, chosen, rejected} rows (or rankings, with ``ranking_key``)."""
    heldout_path: str | None = None
    """Held-out pairs for pairwise accuracy (default: with ``path``, a seeded 10% of its prompts)."""
    ranking_key: str | None = None
    """Rows hold a ranked list under this key (best first) instead of chosen/rejected: every ordered pair."""
    prompts: int = ranged(512, ge=1)
    """Generated: training prompts sampled."""
    heldout_prompts: int = ranged(128, ge=1)
    """Generated: held-out prompts (the task's held-out split)."""
    samples: int = ranged(4, ge=2)
    """Generated: completions per prompt; each two with different gold scores make a pair."""
    temperature: float = ranged(1.0, gt=0)
    """Generated: sampling temperature."""
    label_temperature: float = ranged(0.0, ge=0)
    """Generated: 0 labels by the higher gold score; > 0 draws labels from sigmoid(gold gap / T) (noisy raters)."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class BestOfNConfig:
    """Best-of-n sampling against the reward model (``data.reward_model``): no training, the baseline the RL
    methods must beat. For each n, ``n`` completions per held-out prompt are sampled and the one the reward model
    scores highest is kept; gold and proxy of the kept ones are logged with KL(best-of-n || policy) <= log n -
    (n - 1) / n."""

    n: tuple[int, ...] = ranged(default_factory=lambda: (1, 2, 4, 8, 16), ge=1, le=4096)
    """Sample counts to evaluate (each is one record, logged at step n)."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class EngineConfig:
    """Rollout engine and sampling."""

    name: Literal["hf", "vllm"] = "hf"
    max_new_tokens: int = ranged(8, ge=1)
    temperature: float = ranged(1.0, ge=0)
    top_k: int = ranged(0, ge=0)
    top_p: float = ranged(1.0, gt=0, le=1)
    max_batch: int = ranged(512, ge=1)
    """Rows per generation chunk (hf)."""
    gpu_memory_utilization: float = ranged(0.4, gt=0, le=1)
    """Share of GPU memory vLLM may take (vllm)."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class TextCollectorConfig:
    """How much to sample per update."""

    prompts: int = ranged(32, ge=1)
    """Prompts per batch (SFT: demonstrations per batch)."""
    group_size: int = ranged(8, ge=1)
    """Completions per prompt (GRPO's G)."""
    offload_reference: bool = False
    """Keep the frozen reference model (kl_coef > 0) in host memory and move it to the device only while it
    computes reference log-probs (frees its device memory between steps, for one copy each way per batch)."""
    offload_reward_model: bool = False
    """Keep the reward model (``data.reward_model``) in host memory and move it to the device only while it scores
    a batch (frees its device memory between steps, for one copy each way per batch). Sharded with the learners
    (--dist.shard fsdp): its shards wait in host memory and visit the device a unit at a time while it scores (FSDP's
    CPU offload). On a CPU device nothing moves."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class LLMEvalConfig:
    """Held-out evaluation."""

    prompts: int = ranged(500, ge=1)
    """Held-out prompts scored at each evaluation."""
    samples: int = ranged(8, ge=0)
    """Sampled completions per prompt for pass@k (0: greedy only)."""
    pass_k: int = ranged(4, ge=1)
    temperature: float = ranged(1.0, gt=0)
    """Temperature of the sampled completions."""
    before: bool = True
    """Also evaluate before training (after the warm start), logged at step 0."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class WarmStartConfig:
    """SFT on the task's reference answers before the main algorithm (0 updates: none)."""

    updates: int = ranged(0, ge=0)
    """SFT updates; with ``target_nll``, the most it may take."""
    target_nll: float | None = ranged(None, gt=0)
    """Stop early once the training token NLL, averaged over the last ``NLL_WINDOW`` updates, is at or below this.
    The warm start then ends at the same stage of learning on every machine, however fast SFT gets there (a fixed
    number of updates can stop before a sharp transition on one machine and after it on another). None: always
    run ``updates``."""
    lr: float = ranged(1e-3, gt=0, le=10)
    batch_size: int = ranged(64, ge=1)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    log_every: int = ranged(50, ge=1)

    NLL_WINDOW: ClassVar[int] = 20
    """Updates averaged for ``target_nll`` (one batch's NLL is noisy)."""

    def __post_init__(self) -> None:
        validate(self)


AGENT_TOOLS = ("calculator", "lookup", "python")
"""Tool names ``--agent.tools`` takes (``pickaxe.envs.agents.tools.make_tools``)."""


@dataclass
class AgentConfig:
    """Multi-turn episodes with tools (``tools`` empty: single-turn completions). The model calls a tool with
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, gets its result as a ``tool`` message and speaks
    again; a turn without a call is the final answer, which the task's or file's rewards score."""

    tools: tuple[str, ...] = ()
    """Tools the model may call: calculator, lookup (needs ``corpus``), python (a sandboxed interpreter)."""
    max_turns: int = ranged(4, ge=1, le=1000)
    """Model turns per episode, the final answer included."""
    max_tokens: int = ranged(256, ge=2)
    """Tokens per trajectory: the prompt, every turn and every tool result. Also the length normaliser of the
    sequence-sum loss modes (in place of ``engine.max_new_tokens``, which bounds one turn)."""
    system_prompt: str | None = None
    """Opens every conversation."""
    describe_tools: bool = True
    """Append the tools' descriptions and the call format to the system message when the chat template does not
    render tools itself (off: the model learns them from demonstrations, as the tiny model of the recipes does)."""
    corpus: str | None = None
    """The lookup tool's entries: a .json object or a .jsonl of {key, value} rows."""
    tool_workers: int = ranged(8, ge=1, le=1024)
    """Tool calls run at once."""
    python_cpu_s: float = ranged(2.0, gt=0)
    """CPU seconds per python call."""
    python_memory_mb: int = ranged(256, ge=16)
    """Memory per python call, in MiB: all its processes together where a memory cgroup can be made, and each one's
    address space (docs/sandbox.md)."""
    python_wall_s: float = ranged(5.0, gt=0)
    """Wall seconds per python call (then its process group is killed)."""
    output_chars: int = ranged(2000, ge=1)
    """A python call's output kept, per stream."""
    format_weight: float = ranged(0.0, ge=0)
    """Weight of the ``tool_use`` reward (1 when an episode called a tool and every call was well-formed); 0: logged,
    not trained on."""
    turn_cost: float = ranged(0.0, ge=0)
    """Reward subtracted per model turn (the ``turns`` term, weighted ``-turn_cost``); 0: logged only."""
    demo: Literal["none", "calculator", "python"] = "none"
    """Demonstrations for the SFT warm start on an arithmetic task: call the calculator on the prompt's expression
    (calculator) or print it with the python tool (python), then say the result."""
    python_tools: tuple[str, ...] = ()
    """The user's own tools passed as Python objects (``pickaxe.train(..., tools=[MyTool()])``), which ``tools``
    names: recorded as NAME=MODULE:QUALNAME, since config.json cannot hold them; a resume in another process passes
    them again, or imports them by that path (a class is instantiated with no arguments)."""

    def __post_init__(self) -> None:
        validate(self)
        check_records(self.python_tools, "agent.python_tools")

    @property
    def enabled(self) -> bool:
        """Whether episodes are multi-turn with tools."""
        return bool(self.tools)


@dataclass
class LLMTrainConfig(RunConfig):
    """Everything that decides an LLM run's numbers."""

    KIND: ClassVar[str] = "llm"
    ALGOS: ClassVar[dict[str, type]] = {
        "sft": SFTConfig,
        "grpo": GRPOConfig,
        "ppo": LLMPPOConfig,
        "rm": RewardModelConfig,
        "dpo": DPOConfig,
        "bon": BestOfNConfig,
    }

    algo: Any = field(default_factory=GRPOConfig)
    """SFTConfig, GRPOConfig, LLMPPOConfig, RewardModelConfig, DPOConfig or BestOfNConfig; its type picks the
    method."""
    model: LMConfig = field(default_factory=LMConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    preferences: PreferenceConfig = field(default_factory=PreferenceConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    collector: TextCollectorConfig = field(default_factory=TextCollectorConfig)
    eval: LLMEvalConfig = field(default_factory=LLMEvalConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Tools and multi-turn episodes (none by default)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    """The best-checkpoint rule (``RUN/selection.json``, ``pickaxe eval --checkpoints best``)."""
    alarms: AlarmConfig = field(default_factory=AlarmConfig)
    """Reward-hacking alarms watched at every evaluation."""
    dist: DistConfig = field(default_factory=DistConfig)
    seed: int = ranged(0, ge=0, lt=2**63)
    device: str = device_field()
    """auto (CUDA when available), cpu, cuda, cuda:N or mps."""
    torch_threads: int = ranged(1, ge=1, le=4096)
    recipe: str = "custom"

    def check_more(self, pending: Sequence[Path] = ()) -> None:
        """The LLM libraries are installed, the tiny model's shape, and every input file and folder (see
        ``_check_inputs``)."""
        import importlib.util

        for module in ("transformers", "tokenizers"):
            if importlib.util.find_spec(module) is None:
                raise PickaxeError(f"LLM recipes need {module}: pip install 'pickaxe[llm]'")
        self._check_dist()
        from pickaxe.envs.text.rewards import parse_reward_spec
        from pickaxe.envs.text.synthetic_preferences import GOLD_SCORES

        # a task's check exists only once the task is built, Python rewards once they are passed: names only here
        stand_in = {"verify": len, **GOLD_SCORES, **dict.fromkeys(self.data.python_reward_names(), len)}
        for key, spec in (("data.reward", self.data.reward), ("data.gold", self.data.gold)):
            if spec is not None:
                try:
                    parse_reward_spec(spec, stand_in)
                except ConfigError as e:
                    raise ConfigError(f"--{key.replace('_', '-')}: {e}") from None
        self._check_inputs(pending)
        if isinstance(self.algo, BestOfNConfig) and not self.data.reward_model:
            raise ConfigError("best-of-n ranks samples by a reward model: set --data.reward-model DIR")
        if self.recipe in ("synthetic-ppo", "synthetic-rloo") and not self.data.reward_model:
            raise ConfigError(
                f"{self.recipe} trains against a reward model: set --data.reward-model DIR (the export of a "
                "synthetic-rm run), or run every stage with `pickaxe pipeline rlhf-synthetic`"
            )
        self._check_agent()
        self.check_supplied()
        needs_pairs = isinstance(self.algo, RewardModelConfig | DPOConfig)
        if needs_pairs and not self.preferences.path and not self.data.gold:
            raise ConfigError(
                "this run needs preference pairs: set --preferences.path FILE, or --data.gold to label the policy's "
                "own samples"
            )

    def check_supplied(self) -> None:
        """The Python rewards and tools the run names (``data.python_rewards``, ``agent.python_tools``) are passed
        (``pickaxe.train`` / ``pickaxe.resume``) or importable: a ``MissingObjectError`` line naming one otherwise."""
        if not (self.data.python_rewards or self.agent.python_tools):
            return
        from pickaxe.envs.agents.tools import python_tools
        from pickaxe.envs.text.rewards import python_rewards

        python_rewards(self.data.python_rewards)
        python_tools(self.agent.python_tools)

    def _check_inputs(self, pending: Sequence[Path]) -> None:
        """Read every input before any model loads, with the code that reads it when the run starts: the
        preference files whole (every row), the prompt files, the ``--model.path`` and ``--data.reward-model``
        folders (a saved causal LM; a reward model's export); without a path, the tiny model's shape. An input
        under a ``pending`` folder (one an earlier pipeline stage writes) is checked when its stage starts."""
        from pickaxe.envs.text.preferences import load_preferences, split_by_prompt
        from pickaxe.envs.text.prompt_env import load_examples
        from pickaxe.models.folders import check_lm_folder, check_reward_model_folder, check_tiny_shape

        def ready(value: str | None) -> bool:
            return bool(value) and not any(Path(value).absolute().is_relative_to(p) for p in pending)

        m = self.model
        if m.path is None:
            check_tiny_shape(m.hidden, m.heads, m.kv_heads)
        elif ready(m.path):
            check_lm_folder(m.path, "--model.path")
        if ready(self.data.reward_model):
            check_reward_model_folder(self.data.reward_model, "--data.reward-model")
        for key, value in (("preferences.path", self.preferences.path),
                           ("preferences.heldout_path", self.preferences.heldout_path)):  # fmt: skip
            if ready(value):
                try:
                    pairs = load_preferences(value, ranking_key=self.preferences.ranking_key)
                    if key == "preferences.path" and not self.preferences.heldout_path:
                        split_by_prompt(pairs, 0, value)  # the run holds out some of its prompts: there must be two
                except PickaxeError as e:
                    raise ConfigError(f"--{key.replace('_', '-')}: {e}") from None
        for key, value in (("data.path", self.data.path), ("data.eval_path", self.data.eval_path)):
            if ready(value):
                try:
                    load_examples(value, self.data.prompt_key, self.data.answer_key)
                except PickaxeError as e:
                    raise ConfigError(f"--{key.replace('_', '-')}: {e}") from None

    def _check_agent(self) -> None:
        """``--agent.*`` against this run: an algorithm that samples episodes, room for them in the tiny model, a
        corpus for lookup, demonstrations for a warm start, no generation ahead of the learner."""
        a = self.agent
        if not a.enabled:
            return
        own = record_names(a.python_tools)
        unknown = [t for t in a.tools if t not in AGENT_TOOLS and t not in own]
        if unknown:
            choices = ", ".join([*AGENT_TOOLS, *own])
            raise ConfigError(f"--agent.tools: unknown tool {unknown[0]!r}; choose from {choices} (or pass your own)")
        if len(set(a.tools)) != len(a.tools):
            raise ConfigError("--agent.tools names a tool twice; name each once")
        if not isinstance(self.algo, GRPOConfig | LLMPPOConfig):
            raise ConfigError(
                f"--agent.tools: {type(self.algo).__name__} does not sample episodes; use the grpo or ppo algorithm"
            )
        if "lookup" in a.tools and not (a.corpus and Path(a.corpus).is_file()):
            raise ConfigError(
                "--agent.tools lookup needs --agent.corpus FILE (a .json object or .jsonl of key/value rows); "
                + (f"{a.corpus!r} is not a file" if a.corpus else "it is not set")
            )
        if "lookup" in a.tools:
            from pickaxe.envs.agents.tools import load_corpus

            try:
                load_corpus(a.corpus)
            except ValueError as e:
                raise ConfigError(f"--agent.corpus: {e}") from None
        if self.model.path is None and a.max_tokens > self.model.max_positions:
            raise ConfigError(
                f"--agent.max-tokens {a.max_tokens} is more than the tiny model's --model.max-positions "
                f"{self.model.max_positions}; raise --model.max-positions or lower --agent.max-tokens"
            )
        if self.warm_start.updates > 0 and a.demo == "none":
            raise ConfigError(
                "--warm-start.updates on an agent run needs demonstration episodes: set --agent.demo calculator, or "
                "--warm-start.updates 0"
            )
        if a.demo != "none" and a.demo not in a.tools:
            raise ConfigError(f"--agent.demo {a.demo} calls the {a.demo} tool: add it to --agent.tools")
        if self.dist.placement == "separate" and self.dist.mode != "sync":
            raise ConfigError(
                f"--dist.mode {self.dist.mode} generates ahead of the learner, which multi-turn episodes do not do "
                "yet; use --dist.mode sync with --agent.tools"
            )

    def _check_dist(self) -> None:
        """``--dist.*`` against this run: rollout workers need an algorithm with rollouts, a prompt per worker and
        a GPU per vLLM worker; data-parallel learners need an algorithm that splits its update."""
        d = self.dist
        d.check(llm=True)
        if d.learners > 1 and isinstance(self.algo, BestOfNConfig):
            raise ConfigError(
                f"--dist.learners {d.learners}: {type(self.algo).__name__} does not split its update among learners; "
                "use --dist.learners 1"
            )
        shards = SFTConfig | GRPOConfig | LLMPPOConfig | RewardModelConfig | DPOConfig
        if d.shard != "none" and not isinstance(self.algo, shards):
            raise ConfigError(
                f"--dist.shard {d.shard}: {type(self.algo).__name__} does not shard its models yet (SFT, GRPO, LLM "
                "PPO, the reward model and DPO do); drop --dist.shard"
            )
        if d.shard != "none" and isinstance(self.algo, DPOConfig) and self.model.lora.enabled:
            raise ConfigError(
                f"--dist.shard {d.shard} with --model.lora.r {self.model.lora.r}: DPO's reference is the LoRA policy "
                "with its adapters off, which every learner scores pairs with; drop --dist.shard (data-parallel "
                "learners hold the small adapters whole)"
            )
        if d.placement != "separate":
            return
        if not isinstance(self.algo, GRPOConfig | LLMPPOConfig):
            raise ConfigError(
                f"--dist.placement separate runs the rollout engine in workers; {type(self.algo).__name__} has no "
                "rollouts: drop --dist.placement"
            )
        if d.workers > self.collector.prompts:
            raise ConfigError(
                f"--dist.workers {d.workers} is more than --collector.prompts {self.collector.prompts}: every worker "
                "needs a prompt of each batch; lower --dist.workers or raise --collector.prompts"
            )
        if self.engine.name == "vllm" and d.worker_gpus == 0:
            raise ConfigError("--engine.name vllm in engine workers needs a GPU each: add --dist.worker-gpus 1")
