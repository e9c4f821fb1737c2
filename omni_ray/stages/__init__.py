"""Serve-side stages: the engine actor that steps the pipeline core's stage logic
(``omni_ray/pipeline``) and routes it through Ray, and the Serve front (replica, supervisor)."""
