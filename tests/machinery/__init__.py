"""Machinery: attnbook (runs, parameters, sweeps and checkpoints, the store, claims, the CLI),
on tiny books."""
