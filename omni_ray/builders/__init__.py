"""Builders: validated args -> Serve Application."""
