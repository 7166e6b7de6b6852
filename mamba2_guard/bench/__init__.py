"""Measurement on the device (or the CPU interpreter): precision, timing, peaks, clocks."""
