"""Calibration: fit the cost model's parameters to measured kernel timings (fit), and time kernels
on a real GPU to produce those measurements (profile)."""
