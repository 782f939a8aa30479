"""What the encryption layer adds to a decrypted event's dict for the
parts that judge it, which import it without nio."""

# The sending device of a decrypted event, for the answer log's leaf (and
# the mark that it was decrypted here: the homeserver holds its ciphertext).
DEVICE = "askwright.device"
