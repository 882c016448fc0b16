"""Workloads: the request record and its columnar arrays, synthetic generators, trace formats
and the transforms that turn a trace into the requests a run replays."""
