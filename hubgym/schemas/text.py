"""Text from stored data, made safe to print on a terminal or draw in a plot.

    plain("\\x1b[31mred")     # '\\\\x1b[31mred': the escape byte shown, never sent to the terminal

A shard, a manifest or a trace is bytes from someone else: an env name, a metric name or an error message in it
may hold terminal control sequences (colours, cursor moves, a title change, a bidi override that reorders what
is read). Every table and message hubgym prints from such values passes them through `plain`, which writes each
character Python calls unprintable (control, format, separator other than the space, unassigned) as its escape,
so the terminal shows what the data holds instead of obeying it.
"""

from __future__ import annotations


def plain(text: object) -> str:
    """`text` as a string whose unprintable characters are written as escapes (`\\x1b`, `\\n`, `\\u202e`)."""
    text = str(text)
    if text.isprintable():  # the common case, in C
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
