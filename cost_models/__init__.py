"""ranknas: cost_models."""
