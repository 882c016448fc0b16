"""The simulated serving engine: protocols, KV cache, scheduling, cost model, swap, the replica
process, clusters with routers, and the one run loop that builds all of it from a config."""
