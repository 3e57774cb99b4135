"""Scale-out on Ray: rollout workers (env workers, engine workers with versioned weight sync), data-parallel
learners and sweeps on a cluster. Ray is imported only when one of these is used (the ``dist`` extra)."""
