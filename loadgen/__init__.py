"""Load generator: Locust scenarios that measure TTFT, ITL and throughput against every engine."""
