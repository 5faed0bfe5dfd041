"""Floor 1, contracts: the knobs, the thresholds, the series names and the run folder every other part reads and writes."""
