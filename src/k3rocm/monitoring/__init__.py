"""The monitoring generators: the Grafana dashboard and the Prometheus alert
rules, built from the metric names the code exports."""
