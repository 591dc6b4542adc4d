"""Plan search: enumerate every valid layout, prune by memory, rank by predicted speed, explain."""
from .space import SearchSpace
from .engine import SearchResult, search_plans

__all__ = ["SearchSpace", "SearchResult", "search_plans"]
