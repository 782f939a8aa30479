"""How events come in and go out: the sync loop (bot mode), the appservice's transactions and its look into the timelines, the nio client as a transport, rooms, send pacing."""
