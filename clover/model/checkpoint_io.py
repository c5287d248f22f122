"""Checkpoint loading and saving in the published Clover layout (SPEC §9). (being written)"""


class CheckpointMixin:
    """`from_pretrained` / `save_pretrained` for the Clover layout."""
