"""Research scripts run from a checkout (`python -m benchmarks.<name>`), not installed with speechrt: the
studies behind the server's defaults and the tools that measured them. See benchmarks/README.md."""
