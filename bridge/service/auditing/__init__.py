"""The verifiable answer log: its key, its checkpoints and what the room keeps of them (issue 32)."""
