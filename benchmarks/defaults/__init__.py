"""Every algorithm's defaults: the quick numbers, default outcomes on every dataset, defaults on skewed sites, tune's cost."""
