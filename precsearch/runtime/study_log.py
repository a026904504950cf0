"""The one place a running study tells the user something: an INFO record of the ``precsearch`` logger.

One line per event; a worker's name (``[w1]``) starts its lines. The logger's default handler
(:mod:`precsearch.utils.log`) writes them above the progress bars.
"""

from __future__ import annotations

from precsearch.utils.log import logger


def say(ctx, message: str) -> None:
    """Log ``message`` for the study run ``ctx`` (its ``name`` prefixes the line)."""
    logger().info(f"[{ctx.name}] {message}" if ctx.name else message)
