"""GRPO on your own prompts (a JSONL file), with your own reward function and your own local model folder, to an
exported model; then load the trained policy and generate.

    python examples/grpo_custom_reward.py [TOTAL_STEPS]

The model here is a tiny Qwen2-style LM built from a config and saved to `example-model/` first; point
`model.path` at any local transformers causal LM folder instead. A `datasets.Dataset` becomes such a file with
`dataset.to_json("prompts.jsonl")`.
"""

import json
import random
import sys

import pickaxe as px
from pickaxe.models.lm import tiny_lm
from pickaxe.models.tokenizer import char_tokenizer

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2_048

# 1. a local model folder (weights, config, tokenizer), as a downloaded model would be
tokenizer = char_tokenizer(model_max_length=64)
model = tiny_lm(len(tokenizer), hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, max_positions=64,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
model.save_pretrained("example-model")
tokenizer.save_pretrained("example-model")

# 2. prompts with reference answers, one JSON object a line (other fields reach the reward as metadata)
rng = random.Random(0)
for name, n in (("prompts.jsonl", 512), ("heldout.jsonl", 64)):
    with open(name, "w") as f:
        for _ in range(n):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")


# 3. the reward: any Python function (prompt, completion, metadata) -> float
def close_to_answer(prompt: str, completion: str, metadata: dict) -> float:
    """1 for the right sum, less the further off the first number is, 0 without a number."""
    digits = "".join(c for c in completion.strip() if c.isdigit())[:2]
    return 1.0 / (1 + abs(int(digits) - int(metadata["answer"]))) if digits else 0.0


config = px.train.LLMTrainConfig(
    algo=px.algos.GRPOConfig(lr=1e-3, micro_batch_size=64),
    model=px.train.LMConfig(path="example-model"),
    data=px.train.DataConfig(path="prompts.jsonl", eval_path="heldout.jsonl"),
    engine=px.train.EngineConfig(max_new_tokens=3, temperature=1.0),
    collector=px.train.TextCollectorConfig(prompts=16, group_size=8),
    eval=px.train.LLMEvalConfig(prompts=64, samples=0),
    trainer=px.train.TrainerConfig(total_steps=steps, eval_every=max(steps // 2, 128)),
)
run = px.train(config, "runs/example-grpo", overwrite=True, rewards=[close_to_answer])
print(f"held-out mean reward: {run.final['eval/return_mean']:.3f} at step {run.final['step']}")
print(f"exported to {run.path / 'export'}")  # a transformers folder: the next stage's model.path

# 4. the trained policy, ready to generate (greedy), with the prompt rendered as in training
policy = px.load(run.path, checkpoint="final")
for g in policy.generate(["3+4=", "8+1="]):
    print(f"{g.prompt!r} -> {g.text!r}")
# a resume in a new process passes the reward again: px.resume("runs/example-grpo", rewards=[close_to_answer])
