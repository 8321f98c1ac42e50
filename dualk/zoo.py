"""The model zoo's public names (README, "Model zoo"); the runner is dualk.tools.zoo, tooling the
library itself never imports."""

from .tools.zoo import FuseSummary, Result, environment, run, select, summarize, to_json

__all__ = ["FuseSummary", "Result", "environment", "run", "select", "summarize", "to_json"]
