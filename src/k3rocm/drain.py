"""``--middleware k3rocm.drain.DrainMiddleware`` (launch commands printed by
earlier images): the middleware that moved (k3rocm.aliases)."""

from k3rocm.container.drain import DrainMiddleware

__all__ = ["DrainMiddleware"]
