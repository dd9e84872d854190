"""The node agent: node-local GPU detectors, and the reporter that turns their events into a Node
condition and Events. `running.run()` composes it; nothing here imports the controller."""
