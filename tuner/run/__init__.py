"""A tuning run's lifecycle: its directory (store), creating, searching, finishing (tune), warm
starts (warm), re-tuning (retune) and the progress and summary views (report)."""
