"""Causal depthwise conv1d, forward and backward."""
