"""The split-KV Gluon kernels (Hopper only) over their shared helpers (common.py), each with
serves() and launch() for dispatch/variants.py."""
