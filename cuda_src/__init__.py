"""CUDA C++ sources of dualk's kernels, shipped inside the package for JIT builds."""
