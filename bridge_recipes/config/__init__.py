"""A run's config, built from a recipe and what the user gives: flags, overrides, config files,
datasets, the run's length and save interval, the checks of its values and its fingerprint."""
