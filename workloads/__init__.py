"""Workload YAMLs and small generated sample traces, shipped as simulator.workloads."""
