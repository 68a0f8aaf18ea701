"""The spell tool of this env."""

from hubgym import tool


@tool
def spell(word: str, sep: str = " ") -> str:
    """Spell a word out, letter by letter.

    Args:
        word: the word to spell, e.g. "apple".
    """
    return sep.join(word)  # the fault: `sep` is not under Args, so the model is told nothing about it
