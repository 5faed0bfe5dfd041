"""The comparison report: the reference page's table, latency percentiles, gauges over time and a verdict."""
