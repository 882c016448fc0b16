"""Analyses that run many simulations: parameter sweeps, capacity plans, the regression suite,
vLLM parity checks and the claim experiments."""
