from bridge.service.encryption import nio_import

nio_import.install()
