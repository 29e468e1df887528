"""Scheduling: request states, admission, the step, and the one authority over a request's KV
memory (``memory``)."""
