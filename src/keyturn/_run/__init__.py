"""The runtime: what asks the stores and providers (their capabilities, callers and the
drivers), and what a process keeps between requests (the memo, the usage counts)."""
