"""servelab.mini: the embedded reference engine (a miniature DeepSeek-V4-style model with MTP,
continuous batching, speculative decoding, and an SGLang/vLLM-shaped HTTP server).

Files: config.py (shapes as data), tokenizer.py (bytes), model.py, attention.py (backends),
sampling.py, engine.py, server.py + protocol.py + metrics.py (HTTP), profiler.py, graphs.py
(CUDA graphs), checkpoint.py, train.py, weights/ (the trained `tiny` checkpoint).
Nothing heavy is imported here.
"""
