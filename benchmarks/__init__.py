"""The benchmarks: one folder per study, shared helpers in ``common``; README.md lists them."""
