"""Triton kernels of tfd, each beside its torch reference and its launcher (DESIGN section 10)."""
