"""qrl: efficient reinforcement learning in JAX — quantized and sparse agents."""

__version__ = "0.1.0"
