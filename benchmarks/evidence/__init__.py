"""Where do the AUC methods beat cross-entropy? The evidence study (docs/evidence.md): study, report, plots, run."""
