"""Check the estimator against measured published runs (shared/data/published_runs.csv)."""
