"""Kubernetes access: client construction, raw JSON requests, reflectors, slim caches, leasing."""
