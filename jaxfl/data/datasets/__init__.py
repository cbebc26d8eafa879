"""The real datasets: each loader finds a dataset's files, converts them once into the cache, and returns it.

`jaxfl.data.registry` maps the names (`shakespeare`, `emnist`, ...) to these
loaders; docs/datasets.md describes each dataset, its files and statistics.
"""
