"""Shared test setup: one torch thread (see README: small models on shared CPUs)."""

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _datasets_in_a_test_folder(tmp_path_factory: pytest.TempPathFactory):
    """Datasets an offline recipe makes go to this session's own folder, never the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PICKAXE_DATASETS", str(tmp_path_factory.mktemp("datasets")))
        yield


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
