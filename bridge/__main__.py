from bridge.cli import main

raise SystemExit(main())
