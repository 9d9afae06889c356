"""Vision-language data: image conversations built into Energon datasets, and their checks."""
