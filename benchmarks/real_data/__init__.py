"""Do the AUC methods help on real imbalanced data? The real-data study (docs/real-data.md) and the readers."""
