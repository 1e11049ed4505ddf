"""Many tunings in one command: the sweep file (plan) and its execution over shared workers (execute)."""
