"""Adapters: one outside thing each (git, GitHub, SQLite history, Prometheus, state dir, child processes, files)."""
