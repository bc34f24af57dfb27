"""The metrics plugin vLLM loads: step-latency metrics, the smoke verdict
gauge and the build info."""
