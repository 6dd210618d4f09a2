"""Built-in model handlers."""
