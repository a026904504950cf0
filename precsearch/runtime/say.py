"""The one place a running study tells the user something (one line per event, above the progress bars)."""

from __future__ import annotations

from tqdm import tqdm


def say(ctx, message: str) -> None:
    if ctx.name:
        message = f"[{ctx.name}] {message}"
    if ctx.progress:
        tqdm.write(message)
    else:
        print(message, flush=True)
