"""The bottom layer: errors, input checks, layout, allocation and timing. Imports nothing from dualk."""
