"""osa_lab's version (bottom floor: any module may quote it, e.g. in a cache key)."""

__version__ = "0.2.0"
