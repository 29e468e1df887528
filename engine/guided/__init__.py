"""Guided output: how a request's output is held to its guide (``engine.request.guide``). A
chat's tools (``tools``: how they reach the prompt; ``tool_parsers``: tool calls read back out of
the output, as it streams), then on xgrammar, in the scheduler's process: ``compiler`` (the
compiled grammars of an engine, with ``compile_worker`` processes) and ``masks`` (a step's token
masks)."""
