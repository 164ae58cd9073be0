"""Throughput benchmarks: run with ``python -m bench``."""
