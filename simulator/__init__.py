"""kvsim: a discrete-event simulator of KV-cache lifecycle and batching for LLM serving.

The data path reads in one direction (see DESIGN.md):
config -> SimConfig -> Workload -> Replica(Scheduler <-> KVCacheManager, CostModel) -> Metrics.
"""

__version__ = "0.1.0"
