"""What several studies share: trained cells (study_cells), bad-input tables (casetable), generated data (data)."""
