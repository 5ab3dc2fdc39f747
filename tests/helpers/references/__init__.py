"""float64 (or exact) references of the ops, shared by the op tests and the host-execution tests: one module an op."""
