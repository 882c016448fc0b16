"""Hardware facts: model architectures (catalogue + HF config.json), GPU profiles, and vLLM's
memory math (weights, activations, KV blocks per GPU)."""
