"""Measuring a ViT: per-layer metrics and probes (one metric table), the analysis of a model on a batch, its
depth phases, the depth recommendation, block influence, and plots and tables of the curves."""
