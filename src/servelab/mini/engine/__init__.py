"""The serving engine: continuous batching over the model's KV cache (engine), its arguments,
requests and sampling, CUDA graphs, the step profiler, the KV budget check made before
allocating, and the KV handoff of prefill/decode disaggregation. Imports model/ only."""
