"""Small utilities every layer may use: YAML loading, process helpers, retries."""
