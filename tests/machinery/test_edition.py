"""The student edition's notebooks: solution blocks taken out, everything else kept."""

from __future__ import annotations

from attnbook.edition import strip_solutions, student_notebook

TEXT = """Intro.

```{exercise} Shift
:label: ex-shift

Show that the softmax is shift invariant.
```

```{solution} ex-shift
:class: dropdown

Subtract $c$ from every score: the factor $e^{-c}$ cancels.
```

::::{solution} ex-other
:::{note}
A nested note.
:::
Secret words.
::::

Closing text.
"""


def test_solutions_go_and_exercises_stay():
    out = strip_solutions(TEXT)
    assert "{solution}" not in out and "cancels" not in out and "Secret words" not in out
    assert "A nested note" not in out
    assert "Show that the softmax is shift invariant." in out and out.endswith("Closing text.\n")
    assert "\n\n\n" not in out


def test_a_notebook_keeps_its_code_cells():
    nb = {"cells": [{"cell_type": "markdown", "source": TEXT},
                    {"cell_type": "code", "source": "x = 1  # {solution} in code is code"}]}
    out = student_notebook(nb)
    assert "cancels" not in out["cells"][0]["source"] and nb["cells"][0]["source"] == TEXT
    assert out["cells"][1] == nb["cells"][1]
