"""askwright-bridge: a Matrix bridge for agents' question sets."""

__version__ = "0.1.0"
