"""Hardware facts: model architectures (catalogue + HF config.json), GPU profiles, vLLM's
memory math (weights, activations, KV blocks per GPU) and the start-up limits vLLM enforces."""
