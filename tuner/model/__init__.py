"""From a model to a faster model: find its hot operators (profile) and write them out to tune (emit)."""
