"""Federated survival on Fed-TCGA-BRCA (docs/survival.md)."""
