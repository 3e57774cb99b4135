"""DPO and a reward model from your own preference file ({prompt, chosen, rejected} JSONL), on a local model.

    python examples/dpo_preferences.py [TOTAL_STEPS]

Both start from a recipe's settings (`synthetic-dpo`, `synthetic-rm`) with the data and model replaced by
overrides, checked as `pickaxe train` checks its flags. Each run exports its result to RUN_DIR/export.
"""

import json
import random
import sys

import pickaxe as px
from pickaxe.models.lm import tiny_lm
from pickaxe.models.tokenizer import char_tokenizer

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 4_096

tokenizer = char_tokenizer(model_max_length=64)
model = tiny_lm(len(tokenizer), hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, max_positions=64,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
model.save_pretrained("example-model")
tokenizer.save_pretrained("example-model")

rng = random.Random(0)
with open("pairs.jsonl", "w") as pairs, open("prompts.jsonl", "w") as prompts:
    for _ in range(256):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        wrong = str(a + b + rng.choice([-2, -1, 1, 2]))
        pairs.write(json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": wrong}) + "\n")
        prompts.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")


def is_sum(prompt: str, completion: str, metadata: dict) -> float:
    """The held-out score of the DPO policy's greedy answers: 1 for the right sum."""
    return float(completion.strip() == metadata["answer"])


data = {"model.path": "example-model", "warm_start.updates": 0, "data.gold": None, "preferences.path": "pairs.jsonl"}
budget = {"trainer.total_steps": steps, "trainer.eval_every": max(steps // 2, 128), "collector.prompts": 32}

rm = px.train("synthetic-rm", "runs/example-rm", overwrite=True, **data, **budget, **{"algo.lr": 1e-3})
print(f"reward model: held-out pair accuracy {rm.final['eval/accuracy']:.3f}, exported to {rm.path / 'export'}")

dpo = px.train("synthetic-dpo", "runs/example-dpo", overwrite=True, rewards=[is_sum], **data, **budget,
               **{"algo.lr": 1e-3, "data.path": "prompts.jsonl", "eval.prompts": 64, "eval.samples": 0})  # fmt: skip
print(f"DPO: held-out pair accuracy {dpo.final['eval/eval_accuracy']:.3f}, greedy sum correct {dpo.eval_return:.3f}")
policy = px.load(dpo.path, "final")
print(f"'2+3=' -> {policy.generate('2+3=').text!r}")
