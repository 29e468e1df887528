"""More than one rank: the collectives a tensor-parallel group takes (``comm``)."""
