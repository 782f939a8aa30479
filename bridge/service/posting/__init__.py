"""From set folders to rooms: the poster, question media, the sets folder."""
