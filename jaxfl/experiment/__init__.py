"""Runs, sweeps and model families from a configuration, and their outputs."""
