"""promptbus: a Kafka consumer service for LLM work."""

__version__ = "0.1.0"
