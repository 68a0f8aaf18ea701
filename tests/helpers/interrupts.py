"""What a test raises inside a training step to stop a run there, as a kill would."""


class Interrupted(Exception):
    """Stands in for a kill after the checkpoint of step 1."""
