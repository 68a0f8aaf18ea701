"""Rollouts and re-scoring on a Ray cluster (the optional extra `hubgym[ray]`; Ray is imported only when used).

    from hubgym.cluster.ray_rollout import run_on_ray
    summary = run_on_ray(RolloutConfig(envs=["arithmetic"], model=MODEL, out="/shared/runs/r1"), workers=4,
                         address="10.0.0.1:6379")
    from hubgym.cluster.ray_score import rescore_on_ray
    result = rescore_on_ray("/shared/runs/r1", out="/shared/runs/r1-v2", address="auto")

ray_common: connecting, the install hint, the run-folder probe; board: one progress bar for all workers;
ray_rollout: one worker per shard; ray_score: re-scoring batches as Ray tasks.
"""
