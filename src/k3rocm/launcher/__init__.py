"""Kimi-K3 launcher: one checked `vllm serve` command (and its environment)
from a few settings, for one node or several (vLLM's native multi-node).

    python -m k3rocm.launcher [--dry-run] [options] [-- more vLLM flags]
"""
