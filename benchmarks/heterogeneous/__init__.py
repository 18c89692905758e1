"""Heterogeneous sites (docs/real-data.md, docs/tune.md): server optimizers, personalization, default stability."""
