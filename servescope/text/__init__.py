"""Floor 1, text: the words, numbers and command names every output shares (plurals, printable strings, usage names)."""
