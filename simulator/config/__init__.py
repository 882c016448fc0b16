"""Configuration: the typed SimConfig schema, YAML + `--set` loading, vLLM-default resolution,
the plug-in registry and where packaged data lives. Imports nothing above errors."""
