"""Detectors: plugins that observe and publish `CollectorEvent`s. They never write to the API."""
