"""Reports: terminal, Markdown, JSON and SVG, from the judged documents."""
