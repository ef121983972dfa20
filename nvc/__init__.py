"""nvc-py: makes NVIDIA GPUs appear inside containers, and shares them between containers."""

__version__ = "0.2.1"
