"""A group of ranks (``--tp N``, ``--pp M``): the collectives its ranks take (``comm``), which
layers a pipeline stage runs (``pipeline``), and processes started on this machine (``spawn``).
How a group boots around an engine is ``engine.core.group_boot``."""
