"""The built-in answers every question offers (PROTOCOL section 2).

Kept apart from ``model`` so the judge and the renderers, which need only
these names, do not load the pydantic models on the bridge's way to its
first sync."""

UNSURE_ID = "unsure"
OTHER_ID = "other"
UNSURE_LABEL = "Not sure, ask me later"
OTHER_LABEL = "Something else"
BUILTIN_IDS = (UNSURE_ID, OTHER_ID)
