"""The spell tool of this env."""

from hubgym import tool


@tool
def spell(word: str) -> str:
    """Spell a word out, letter by letter.

    Args:
        word: the word to spell, e.g. "apple".
    """
    raise RuntimeError("the spelling service is down")  # the fault: no call can succeed
