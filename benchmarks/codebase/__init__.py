"""Facts about the code the docs show: the module index, the support matrix, how far a setting walks, the quick subset's time."""
