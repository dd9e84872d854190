"""Benchmarks: numbers printed and compared as ratios to targets, never timed assertions."""
