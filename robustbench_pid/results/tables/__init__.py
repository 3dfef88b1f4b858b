"""Tables for people: the paper, long and wide layouts, model comparisons, the worst-case row and rendering
to Markdown, LaTeX, CSV and HTML."""
