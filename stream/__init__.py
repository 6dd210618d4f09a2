"""Kafka streaming micro-batch inference worker."""

__version__ = "0.1.0"
