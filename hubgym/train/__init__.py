"""Train: GRPO on DeepSpeed (shard stream, groups, advantages, losses, checkpoints, weight sync)."""
