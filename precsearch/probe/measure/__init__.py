"""What a probe measures besides its loss: diagnostics, events, signals, risk, sensitivity, timing."""
