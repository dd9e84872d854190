"""Recovery: decide what to do about a fault (`policy`) and do it safely (`executing`, `ledger`, `engine`).

Only the leader executes. Decisions are pure functions over the cache's slim projections (`kube.projections`);
workload kinds are described by `adapters`. Nothing here imports the simulated cluster.
"""
