"""How chunks move between stages: Ray object-ref push (``ray_push``) and an in-process twin."""
