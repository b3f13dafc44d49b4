"""Feather: a reproducible benchmark suite for prefix-aware LLM serving."""

__version__ = "0.1.0"
