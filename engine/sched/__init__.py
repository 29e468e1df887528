"""Scheduling: request states, admission, the step."""
