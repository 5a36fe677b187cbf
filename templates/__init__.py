"""Package data: Jinja2 templates per target (installed as l2c._templates)."""
