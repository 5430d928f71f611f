"""Triton kernels where engines fall back to slow ones; each with a reference, test and benchmark."""
