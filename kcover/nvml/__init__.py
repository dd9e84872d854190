"""NVML access for the agent: the `Nvml` protocol, the real pynvml adapter and a fake with injectable faults."""
