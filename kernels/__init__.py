"""Attention and other hot kernels behind one interface (see kernels.attention)."""
