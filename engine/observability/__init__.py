"""Observability: the receipt schema (torch-free), receipt emitters, tracing, metrics."""
