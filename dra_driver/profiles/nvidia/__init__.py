"""NVIDIA GPUs: discovery through NVML or a simulated node, CDI edits, MPS and time-slicing."""
