"""Recovery: decide what to do about a fault (`policy`) and do it safely (`executing`, `ledger`, `engine`).

Only the leader executes. Decisions are pure functions over slim views of the cluster (`views`);
workload kinds are described by `adapters`. Nothing here imports the simulated cluster.
"""
