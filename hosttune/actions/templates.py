"""Files rendered from `templates/`: the actions' name for the one Jinja environment (hosttune/rendering.py), which the
checks that compare a host's copy with what apply would write use too."""

from hosttune.rendering import render

__all__ = ["render"]
