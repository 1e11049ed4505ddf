"""Where evaluations happen: worker processes (worker), what a benchmark worker does for one
candidate (measure), and the Evaluator over local or Ray workers (evaluate, ray_executor)."""
