"""The active-output policy: the guest's HTML, Markdown, SVG and widget state made passive before
they reach a front end.

May import: nothing of the package.
"""
