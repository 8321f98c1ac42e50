"""Triton kernels of dualk: one module per operator, each with its kernels and launch function."""
