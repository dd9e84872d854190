"""The controller role: `running.run()` composes one replica (see `kcover.controller.running`)."""

from kcover.controller.running import Controller, run

__all__ = ["Controller", "run"]
