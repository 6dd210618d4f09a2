"""Event producers: a seeded demo-event generator and a load-generator CLI."""
