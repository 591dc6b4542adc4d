"""Specifications: what a model is (:mod:`.model`) and what a cluster is (:mod:`.hardware`)."""
