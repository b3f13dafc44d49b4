"""Benchmarks: programs that print numbers (timing claims live here, not in unit tests)."""
