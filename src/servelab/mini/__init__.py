"""servelab.mini: the embedded reference engine (a miniature DeepSeek-V4-style model with MTP,
continuous batching, speculative decoding, and an SGLang/vLLM-shaped HTTP server).

Folders, imports pointing down only: server/ (HTTP, its PD role) -> engine/ (scheduling,
sampling, KV handoff) -> model/ (config, tokenizer, the model, checkpoints); router/ is its own
process and imports nothing else of mini. train.py (`python -m servelab.mini.train`) trains the
shipped checkpoint in weights/. Nothing heavy is imported here.
"""
