"""Cutting a trained ViT: the cut strategies (one registry), block surgery on the classifier layout, healing,
the search for the cheapest cut within an accuracy bound, and its cost and report."""
