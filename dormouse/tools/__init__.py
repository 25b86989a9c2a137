"""Trust tools: `bench` (measured performance rows) and `replay` (a step replayed in two processes)."""
