"""Book: the executed chapters' summaries and the stored paper-scale tables against the chapters' code."""
