"""C source text as the repository's checkers read it (tests/cloexec_lint.py,
scripts/check-layers.py, scripts/call-cycles.py): one place for what a comment and a literal
are. Standard library only; imported, never run."""


def blank(text, strings):
    """text with comments (and, with strings, string and character literals' contents)
    replaced by spaces, newlines kept: offsets and line numbers stay the same."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [ch if ch == "\n" else " " for ch in text[i:j]]
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            if strings:
                out[i + 1:j] = " " * (j - i - 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)
