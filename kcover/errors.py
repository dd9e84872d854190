"""The one exception tree of kcover. Library errors are wrapped with `raise ... from exc`."""

from __future__ import annotations


class KcoverError(Exception):
    """Base of every error kcover raises on purpose."""


class ConfigError(KcoverError):
    """A configuration file, environment variable or flag is invalid. `errors` lists field-level messages."""

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []

    def __str__(self) -> str:
        if not self.errors:
            return super().__str__()
        return super().__str__() + "\n" + "\n".join(f"  {e}" for e in self.errors)


class PluginError(KcoverError):
    """A detector plugin could not be loaded, configured or started."""


class UnknownDetectorError(ConfigError):
    """The configuration names a detector that no installed distribution provides."""


class KubeError(KcoverError):
    """An API request failed. `status` is the HTTP status, `reason` the Status reason when known."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "", retry_after: float | None = None,
                 body: object = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after
        self.body = body


class NotFoundError(KubeError):
    """404."""


class ConflictError(KubeError):
    """409: AlreadyExists or Conflict (stale resourceVersion)."""


class GoneError(KubeError):
    """410: the resourceVersion is too old; the caller must re-list."""


class TooManyRequestsError(KubeError):
    """429, plain text or Status; `retry_after` in seconds when the server said."""


class LedgerUnavailable(KcoverError):
    """The recovery ledger cannot be read or written: its LedgerEntry kind is not served (the CRD is missing).
    kcover refuses to act without its ledger (it would forget cooldowns, budgets and intents)."""


class NotLeaderError(KcoverError):
    """A write was attempted by a replica that does not hold the Lease."""


class NvmlError(KcoverError):
    """NVML failed. `code` names the condition: library_missing, no_gpu, gpu_lost, not_supported, unknown."""

    def __init__(self, message: str, *, code: str = "unknown") -> None:
        super().__init__(message)
        self.code = code


class DetectorUnavailableError(KcoverError):
    """A detector cannot run on this node (no GPU, no driver, no DCGM). Reported once, retried slowly."""
