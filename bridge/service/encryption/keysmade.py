"""Which device the bridge made its encryption keys for, in both modes.

nio names its key store by user and device; the store says which device
the keys were made for.  A device whose key store is gone from the key
folder (the folder lost, the store restored without it, a standby with a
folder of its own) must not go on under that device id: a new account there
reads nothing people send, since the homeserver keeps the old account's
one-time keys, which their clients go on claiming.
"""

from __future__ import annotations

import os
from typing import Any

CRYPTO_DEVICE = "crypto_device"  # meta: the device the key folder holds keys for


def keys_made(store: Any, device_id: str) -> None:
    if store.get_meta(CRYPTO_DEVICE) != device_id:
        with store.transaction():
            store.set_meta(CRYPTO_DEVICE, device_id)


def keys_lost(store_path: str, store: Any, user_id: str, device_id: str) -> bool:
    """A device the bridge made keys for whose key store is not in the key folder."""
    return bool(device_id) and store.get_meta(CRYPTO_DEVICE) == device_id \
        and not os.path.exists(os.path.join(store_path, f"{user_id}_{device_id}.db"))
