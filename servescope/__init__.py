"""servescope's shared contracts: engine kinds, knobs, metric names and the run folder."""
