"""The OpenAI-compatible HTTP frontend."""
