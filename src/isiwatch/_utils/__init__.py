"""Internal helpers that know nothing of models: atomic file writes, state-dict checks, torch thread counts."""
