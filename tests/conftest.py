"""Shared test setup: one torch thread (see README: small models on shared CPUs)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance shared by the session's tests (started once, ~5 s; 4 logical CPUs so that two
    workers and a learner fit on a 2-core machine)."""
    from pickaxe.dist.runtime import ensure_ray

    ray = ensure_ray(None, num_cpus=4)
    yield ray
    ray.shutdown()
