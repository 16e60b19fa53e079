"""The HTTP routes, one module per surface; each handler parses, delegates and renders."""
