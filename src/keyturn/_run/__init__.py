"""The runtime: what asks the stores and providers (their capabilities, callers and drivers)."""
