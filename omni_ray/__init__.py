"""omni_ray."""
