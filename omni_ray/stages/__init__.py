"""Serve-side stages: Ray-free stage logic, the engine actor that owns it, the Serve front."""
