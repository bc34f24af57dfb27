"""The patch tool: applies, checks and reverts the distribution's patch
series on a vLLM tree, idempotent and crash-safe."""
