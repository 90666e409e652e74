"""Core: device and precision resolution, capabilities, autocast, grad scaler, AdamW."""
