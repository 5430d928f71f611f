"""Telemetry over a load point's duration: the engine's Prometheus series (server.py), the GPUs
through NVML (gpu.py), energy per token (energy.py) and whether the point was steady
(steady.py). Imports only top-level helpers: bench/ and experiment/ call into it, never back."""
