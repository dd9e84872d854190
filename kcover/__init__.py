"""kcover: fault awareness and recovery for AI training jobs on Kubernetes GPU clusters."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("kcover")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
