"""Tooling the library never imports: benchmark engine, reports, plots, smoke check, model zoo."""
