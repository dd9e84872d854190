"""The simulated Kubernetes cluster: an in-process API server faithful to K8S-SEMANTICS.md.

`kcover.sim.server.SimServer` is the entry point; the other modules are its parts. Nothing in the
product path imports this package.
"""
