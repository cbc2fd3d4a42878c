"""The dashboard: first-view screenshots, a chart refresh's cost, many pages on one live run."""
