"""Rollout: engines (vLLM offline, OpenAI-compatible servers), the agent loop, and the shard writer."""
