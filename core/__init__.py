"""CUDA Agent core: everything that runs without Qt (CLI, tests, notebooks)."""
