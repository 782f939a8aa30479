"""End-to-end encryption in both modes: nio's olm machine, appservice mode's device, key requests, nio's key store, cross-signing."""
