"""Metrics: the recorder the engine hands each step and request to, the run summary, statistics,
time series, the OpenMetrics export and alert rules."""
