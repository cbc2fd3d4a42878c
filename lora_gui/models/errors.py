"""The error a model loader raises for the user (kept apart so that loaders can share it
without importing each other)."""

from lora_gui.errors import UserError


class ModelError(UserError, ValueError):
    """The base model cannot be found or loaded; the message says why and what to do."""
