"""The probe: a small Llama 3 model and the token streams it trains on."""
