"""Alternative engine backends behind kvsim's engine protocols: vLLM's own v1 scheduler and block
pool (vllm.py), the truth oracle for kvsim's scheduling semantics."""
