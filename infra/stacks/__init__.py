"""The app's stacks: one per stage."""

from infra.stacks.tollway import StackInputs, TollwayStack

__all__ = ["StackInputs", "TollwayStack"]
