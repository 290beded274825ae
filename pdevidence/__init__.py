"""Rerunnable CPU differential probes for two SGLang PD-disaggregation fixes.

The flow, one module each: registry -> trees -> environments -> probe_run ->
results + receipts -> compare -> report.
"""

__version__ = "0.1.0"
