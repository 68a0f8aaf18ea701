"""Hub: push and pull environments and rollout shards (Hugging Face Hub, or a local hub folder)."""
