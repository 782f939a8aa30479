"""Every rule of the question-set format, as errors and warnings.

``lint`` is pure: the file system and the codec probe come in as callables
(see ``media.Filesystem`` and ``media.Probe``).  Types are checked by the
model (``load.validate_model``); the rules read the raw dict through
tolerant accessors (``access``), so one wrong type never hides the other
findings and never raises.  A rule finding placed at (or under) a place the
model already reported is dropped: the type error is the one thing to fix
there.

Where the format is terse, the decisions taken are written beside the rule.
A rule the format states as a requirement ("not empty", "unique", "ends in
?") is an error; only what it calls "a warning" is a warning.

One module per rule family; ``driver`` runs them in a fixed order, which is
the order of the findings.
"""

from __future__ import annotations

from bridge.questionset.lint.driver import LintResult, lint
from bridge.questionset.lint.options import is_bare_label
from bridge.questionset.lint.wording import is_vague, sentence_count

__all__ = ["LintResult", "is_bare_label", "is_vague", "lint", "sentence_count"]
