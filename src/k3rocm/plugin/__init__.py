"""The plugins vLLM loads: step-latency metrics, the smoke verdict gauge and
the build info (a stat logger), and the stack handler (a general plugin)."""
