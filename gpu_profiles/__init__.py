"""GPU profiles (YAML), shipped as package data of simulator.gpu_profiles."""
