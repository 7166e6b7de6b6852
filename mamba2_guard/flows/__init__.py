"""Flows: nightly, check, autotune, pr, baselines; each composes core + adapters + bench."""
