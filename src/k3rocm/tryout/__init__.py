"""The CPU try-out (scripts/try-cpu): the tiny model and the compose stack
that run kimi-k3-rocm on a machine without a GPU, as the container tests
run it."""
