"""car-ray."""
