"""The native stack: real engines, Prometheus and the exporter as supervised local processes (or Compose)."""
