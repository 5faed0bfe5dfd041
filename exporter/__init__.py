"""Prometheus exporter: one set of engine gauges for vLLM, llama.cpp and Ollama, plus the Ollama proxy."""
