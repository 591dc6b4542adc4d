"""Check the estimator against measured published runs (data/published_runs.csv)."""
