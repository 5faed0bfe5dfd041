"""Test doubles for what cannot run here (Ollama's binary) and exact-timing test servers; never shipped."""
