"""Internal helpers that know nothing of models: atomic file writes and path checks, state-dict checks, torch
thread counts, progress bars."""
