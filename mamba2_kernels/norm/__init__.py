"""Gated RMSNorm, forward and backward."""
