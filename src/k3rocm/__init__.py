"""kimi-k3-rocm: the distribution's own code (patch tool, smoke test, metrics
plugin, launcher) for serving Kimi-K3 on vLLM 0.27.1 on ROCm."""
