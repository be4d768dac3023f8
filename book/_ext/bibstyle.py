"""Author–year bibliography for the book (a local Sphinx extension).

The text cites author–year (``bibtex_reference_style: author_year``); this style makes the
reference list agree: entries sorted by author, year and title, labelled "Fu et al., 2023" with
accents decoded from the BibTeX source (``Zdeborov{\\'a}`` → "Zdeborová"), and each entry ending
with its arXiv and DOI links (pybtex's ``eprint`` and ``doi`` fields).
"""

from __future__ import annotations

import codecs
from collections import Counter

import latexcodec  # noqa: F401  (registers the "ulatex" codec)
from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle


def _surname(person) -> str:
    raw = " ".join(person.prelast_names + person.last_names)
    return codecs.decode(raw, "ulatex").replace("{", "").replace("}", "")


def author_year(entry) -> str:
    """The label of one entry: "Surname, 2023", "A and B, 2023" or "A et al., 2023"."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_surname(p) for p in people]
    if not names:
        who = entry.key
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabels(BaseLabelStyle):
    """Author–year labels; a year letter (2024a, 2024b) separates otherwise equal labels."""

    def format_labels(self, sorted_entries):
        labels = [author_year(e) for e in sorted_entries]
        count = Counter(labels)
        seen: Counter = Counter()
        for label in labels:
            if count[label] > 1:
                seen[label] += 1
                yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label] - 1]
            else:
                yield label


class AuthorYearStyle(UnsrtStyle):
    default_label_style = AuthorYearLabels
    default_sorting_style = SortingStyle


def setup(app):
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
