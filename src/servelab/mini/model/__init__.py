"""The model: shapes as data (config), the byte tokenizer, the decoder with its MTP head and KV
cache, the sparse attention backends, checkpoints. Imports nothing else of servelab.mini."""
