"""Helpers every layer uses: writing output files safely, and keeping other libraries' start-up notices
quiet."""
