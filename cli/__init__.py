"""Command-line apps; thin, no logic of their own."""
