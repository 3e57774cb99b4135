"""Sharded learners built on the ``meta`` device (``--dist.shard fsdp``): a learner other than rank 0 builds its
policy and its frozen KL reference as shapes without memory (it never holds a whole model, so no parameter byte is
allocated at build), shards them and gets its rows from rank 0's whole models, one decoder layer per scatter. Linked
to rank 0 as the launcher links them (``Leader`` / ``follow``), one update from rank 0's warm-started weights equals
the single-process update; :func:`scatter_into` lands rank 0's values bit for bit (tied embeddings too) and the
rotary buffers ``to_empty`` leaves as garbage are rank 0's, so the sharded model's logits are the whole model's."""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from pickaxe.dist import data_parallel
from pickaxe.models.lm import tiny_lm
from pickaxe.models.sharding import is_meta, local_rows, shard_from

sys.path.insert(0, str(Path(__file__).parent))
from learner_group import on_learners, same_metrics
from test_sharded_runs import _cfg
from test_sharding import WEIGHT_ATOL

WORLD = 2


def _param_bytes(modules: list[torch.nn.Module]) -> int:
    """Bytes of the parameters and buffers of ``modules`` that have memory (not on the meta device)."""
    tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
    return sum(t.numel() * t.element_size() for t in tensors if not t.is_meta)


def _scatter_tiny(tied: bool) -> dict[str, Any]:
    """A tiny LM whole on rank 0, on meta elsewhere, sharded and filled with :func:`shard_from`: its weights
    gathered back and its logits (every learner), and rank 0's whole ones."""
    kwargs = dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=3, tied=tied)
    full = tiny_lm(40, **kwargs) if data_parallel.rank() == 0 else None
    with torch.device("meta"):  # every learner's sharded copy, rank 0's beside its whole model
        model = tiny_lm(40, **kwargs)
    assert is_meta(model)
    shard_from(model, full)
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    out = {"logits": model(input_ids=ids).logits.detach()}
    model.reshard()
    out["weights"] = torch.cat([p.full_tensor().flatten() for p in model.parameters()])
    if full is not None:
        out["want_logits"] = full(input_ids=ids).logits.detach()
        out["want_weights"] = torch.cat([p.detach().flatten() for p in full.parameters()])
    return out


def _learner(cases: dict[str, Any], out: Path) -> dict[str, Any]:
    from pickaxe.dist import learners
    from pickaxe.train.build import build_follower

    torch.set_num_threads(1)
    results: dict[str, Any] = {f"scatter_tied_{tied}": _scatter_tiny(tied) for tied in (False, True)}
    cfg = cases["cfg"]
    if data_parallel.rank() == 0:
        trainer = cases["trainer"]  # built (and warm-started) before the group existed, as the launcher does
        algo = trainer.algo
        results["start"] = {k: v.clone() for k, v in algo.policy.state_dict().items()}
        results["reference"] = {k: v.clone() for k, v in algo.reference.state_dict().items()}
        leader = learners.Leader(algo, shard=learners.check_sharding(algo, cfg))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results["metrics"] = algo.update(cases["batch"].clone())
        results["policy"] = {k: v.clone() for k, v in algo.policy.state_dict().items()}
        leader.close()
    else:
        learners._FOLLOWING.append(True)
        trainer = build_follower(cfg.to_dict())
        algo = trainer.algo
        models = [algo.policy, algo.reference]
        results["built_on_meta"] = [is_meta(m) and all(t.is_meta for t in m.parameters()) for m in models]
        results["built_bytes"] = _param_bytes(models)
        results["updates"] = learners.follow(algo)
        results["rows"] = {k: v.to_local().clone() for k, v in algo.model.state_dict().items()}
        results["reference_rows"] = {k: v.to_local().clone() for k, v in algo.reference.state_dict().items()}
    trainer.close()
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the single-process update's policy and metrics, each learner's results), one batch from the
    single-process run's collector (its reference log-probs in it; the sharded learners score their own). Both
    runs warm-start with SFT first: rank 0 sends its warm-started weights, not the seed's."""
    from pickaxe.train.llm import build_llm_trainer

    torch.set_num_threads(1)
    single = build_llm_trainer(_cfg(1))
    batch = single.collector.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = single.algo.update(batch.clone())
    want = {"metrics": metrics, "policy": {k: v.clone() for k, v in single.algo.policy.state_dict().items()}}
    single.close()
    cfg = _cfg(2, "fsdp")
    cases = {"cfg": cfg, "batch": batch, "trainer": build_llm_trainer(copy.deepcopy(cfg))}  # rank 0's (forked)
    try:
        return want, on_learners(_learner, cases, tmp_path_factory.mktemp("meta"), WORLD)
    finally:
        cases["trainer"].close()


def test_the_other_learner_builds_its_models_on_meta_and_fills_only_its_rows(results) -> None:
    _, learners = results
    zero, one = learners
    assert one["built_on_meta"] == [True, True]  # the policy and the frozen KL reference
    assert one["built_bytes"] == 0  # not one parameter or buffer byte before sharding
    assert one["updates"] == 1
    for rows, whole in ((one["rows"], zero["policy"]), (one["reference_rows"], zero["reference"])):
        assert rows.keys() == whole.keys()
        for name, tensor in whole.items():
            start, stop = local_rows(tensor.shape[0], 1, WORLD)
            assert torch.equal(rows[name], tensor[start:stop]), name  # rank 0's rows, bit for bit
        assert sum(t.numel() for t in rows.values()) < 0.6 * sum(t.numel() for t in whole.values())


def test_a_learner_built_on_meta_applies_the_single_process_update(results) -> None:
    want, (zero, _) = results
    same_metrics(zero["metrics"], want["metrics"])
    for name, tensor in want["policy"].items():
        assert (zero["policy"][name] - tensor).abs().max() <= WEIGHT_ATOL, name
    assert any(not torch.equal(zero["start"][k], v) for k, v in zero["policy"].items())  # the update moved it


@pytest.mark.parametrize("tied", [False, True])
def test_scatter_into_gives_rank_0s_weights_and_logits_bit_for_bit(results, tied: bool) -> None:
    _, learners = results
    want = learners[0][f"scatter_tied_{tied}"]
    for learner in learners:
        got = learner[f"scatter_tied_{tied}"]
        assert torch.equal(got["weights"], want["want_weights"])
        assert torch.equal(got["logits"], want["want_logits"])  # rotary buffers rank 0's, not to_empty's garbage
