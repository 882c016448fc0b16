"""Calibration: fit the cost model's parameters to measured kernel timings and write them into the
GPU profiles (data, solve, fit, score, gpu_fit, transfer, sections, report), and time kernels on
a real GPU to produce those measurements (profile)."""
