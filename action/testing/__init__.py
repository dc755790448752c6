"""Running the Action as GitHub does, for tests and benchmarks (no part of the Action)."""
