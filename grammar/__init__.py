"""Package data: the l2c grammar (installed as l2c._grammar)."""
