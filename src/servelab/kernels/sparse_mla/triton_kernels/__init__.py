"""The split-KV Triton kernels (any GPU), each with serves() and launch() for dispatch/variants.py."""
