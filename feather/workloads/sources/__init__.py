"""Benchmark sources: each turns its raw files into prompt groups, its own way."""
