"""Benchmarks behind `make bench`: proxy overhead, exporter scrape cost, load generator accuracy and capacity."""
