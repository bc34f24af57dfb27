"""The container runtime: supervision, readiness, the drain, the stall
watchdog and the start-up metrics of the serving container."""
