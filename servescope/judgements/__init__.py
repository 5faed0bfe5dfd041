"""Floor 4, judgements: the shared rules that turn measurements into answers (SLOs, the binding resource, the knee, statistics)."""
