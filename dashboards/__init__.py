"""Grafana dashboards as code: the generator that writes dashboards/*.json."""
