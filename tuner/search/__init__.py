"""Choosing the next config: the Searcher over Optuna's samplers (searcher) and the guided search
(guided, with gp, encoding, prior)."""
