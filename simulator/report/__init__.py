"""Reports for a run directory: the self-contained HTML page and the PNG plots."""
