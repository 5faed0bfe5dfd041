"""The comparison report: the seed's table, latency percentiles, gauges over time and a verdict."""
