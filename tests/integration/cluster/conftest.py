"""The `cluster` backend's fixtures (realkit.py)."""

from realkit import realcluster  # noqa: F401  (the session fixture)
