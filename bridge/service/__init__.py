from bridge.service import nio_import

nio_import.install()
