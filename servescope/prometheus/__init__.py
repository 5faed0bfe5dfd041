"""Floor 3, Prometheus: its configuration and rules generated, its API and the run sampler that reads engines and Prometheus."""
