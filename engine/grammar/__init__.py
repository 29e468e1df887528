"""Constrained decoding on xgrammar: the compiled grammars of an engine (``compiler``) and the
per-step token masks (``masks``). What a request's output must match is ``engine.guide``'s
``Guide`` (torch-free: the HTTP process builds and checks guides)."""
