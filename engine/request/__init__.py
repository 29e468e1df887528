"""A request as it crosses rooms and processes, torch-free: what it asks of the sampler
(``sampling_params``) and what its output must match (``guide``), the one prompt check
(``prompt``), and every message between the HTTP process and the scheduler process
(``messages``)."""
