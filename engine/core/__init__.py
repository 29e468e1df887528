"""The engine assembled: ``EngineCore`` (model, memory and scheduler from one EngineConfig), the
ranks of a group booted around it (``group_boot``), what it says of itself (``info``), its CPU
threads, and the live changes made to it while it serves (``cutover``, ``phase``)."""
