"""The auditor: reads boot logs, evaluates claims, gives verdicts. Never imports torch."""

__version__ = "0.1.0"
