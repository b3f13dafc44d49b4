"""The simulator: a calibrated continuous-batching engine model for GPU hardware profiles."""
