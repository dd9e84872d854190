"""`kcover status`: what the running kcover is doing and the limits it runs under, read from the cluster.

Three modules: `deployed` finds the settings the controllers run with (the chart's config ConfigMap, as the
chart hands it to them); `gathering` reads, with them, what the cluster holds (the Lease, the controls
ConfigMap, Nodes, Namespaces, workloads, Recovery resources, the ledger) into a `report.Report`, which says what
needs a person and renders it for a terminal or a program. Nothing here writes.
"""
