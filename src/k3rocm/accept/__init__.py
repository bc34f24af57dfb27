"""Acceptance on the operator's own hardware (``python -m k3rocm.accept``):
vLLM's own ``vllm bench serve`` at several concurrencies (k3rocm.accept.bench)
and an accuracy gate of generated arithmetic word problems
(k3rocm.accept.arithmetic, k3rocm.accept.accuracy), written as JSON and
Markdown (k3rocm.accept.report). k3rocm.accept.ab compares the series'
metadata path with vLLM 0.27.1's own (K3_KDA_METADATA) on one compose
service. Nothing here imports vLLM: the benchmark runs as a subprocess."""
