"""After the runs: the tuning database (db) and the runtime that serves its kernels (runtime)."""
